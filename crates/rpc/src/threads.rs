//! SPDK's thread methods: thread_get_stats, thread_get_pollers, thread_get_io_channels.
//!
//! Ferrite runs one thread per reactor, so each reactor is one SPDK "thread": the first is
//! named `app_thread` (SPDK's application thread), the others `reactor_<core>`; ids start at 1
//! as SPDK's do. Busy and idle ticks are the reactor's (`Engine::stats`). The engine does not
//! publish its poller list or per-thread I/O channels, so those lists are empty and the poller
//! counts 0: Ferrite cannot report them honestly yet. thread_get_stats adds each reactor's
//! payload buffer pool (`buffers`): the classes' counts and sizes (`iobuf_set_options`), free
//! buffers per class, heap fallbacks, and the heap budget of the bdev layer's requests with
//! what of it is spent and how often it said no; and its socket receive ring (`recv_buffers`):
//! buffers, size, free ones, chunks received, receives ended by an empty ring (`enobufs`).

use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use crate::registry::{Ctx, Params, Registry, RUNTIME};
use ferrite_reactor::cpumask::format_cpumask;
use serde_json::{json, Value};

/// The SPDK-style name of the thread of reactor `id` on `core`.
pub fn thread_name(id: usize, core: usize) -> String {
    if id == 0 {
        "app_thread".to_string()
    } else {
        format!("reactor_{core}")
    }
}

fn no_params(method: &'static str, p: Params) -> Result<(), RpcError> {
    match p.0 {
        None => Ok(()),
        Some(_) => Err(RpcError::new(INVALID_PARAMS, format!("'{method}' requires no arguments"))),
    }
}

/// `{"tick_rate": .., "threads": [f(thread)...]}` over every reactor.
fn per_thread(ctx: &Ctx, f: impl Fn(&ferrite_reactor::ReactorStats, Value) -> Value) -> Value {
    let threads: Vec<Value> =
        ctx.engine.stats().iter().map(|s| f(s, json!({"name": thread_name(s.id, s.core), "id": s.id + 1}))).collect();
    json!({"tick_rate": ferrite_reactor::tsc::ticks_per_sec(), "threads": threads})
}

/// Registers the thread methods.
pub fn register(reg: &mut Registry) {
    reg.bare_with(
        "thread_get_stats",
        RUNTIME,
        "Each reactor as an SPDK thread: busy and idle ticks, with its buffer pool's use (Ferrite's addition).",
        no_params,
        |ctx| async move {
            // Each reactor's payload buffer pool, beside SPDK's fields (Ferrite's addition): what its
            // classes hold, and how the heap budget of the bdev layer's requests is spent.
            let pools = ctx
                .engine
                .on_all(|_| (ferrite_reactor::buf_pool().map(|p| p.stats()), ferrite_reactor::recv_buf_stats()))
                .await
                .unwrap_or_default();
            Ok(per_thread(&ctx, |s, mut t| {
                t["cpumask"] = json!(format_cpumask(&[s.core]).trim_start_matches("0x"));
                t["busy"] = json!(s.busy_ticks);
                t["idle"] = json!(s.idle_ticks);
                t["active_pollers_count"] = json!(0);
                t["timed_pollers_count"] = json!(0);
                t["paused_pollers_count"] = json!(0);
                if let Some((Some(b), _)) = pools.get(s.id) {
                    t["buffers"] = json!({"pooled": b.pooled, "heap_fallbacks": b.heap_fallbacks,
                    "small_free": b.small_free, "large_free": b.large_free, "jumbo_free": b.jumbo_free,
                    "heap_bytes": b.heap_bytes, "heap_budget": b.heap_budget, "refused": b.refused,
                    "small_count": b.small_count, "large_count": b.large_count,
                    "small_bufsize": b.small_size, "large_bufsize": b.large_size, "registered": b.registered});
                }
                if let Some((_, Some(r))) = pools.get(s.id) {
                    t["recv_buffers"] = json!({"count": r.count, "bufsize": r.size, "free": r.free,
                    "chunks": r.chunks, "enobufs": r.enobufs, "multishot": r.multishot});
                }
                t
            }))
        },
    );
    reg.bare_with(
        "thread_get_pollers",
        RUNTIME,
        "Each reactor's pollers, in SPDK's layout (the lists are empty: Ferrite's pollers are not named).",
        no_params,
        |ctx| async move {
            Ok(per_thread(&ctx, |_, mut t| {
                t["active_pollers"] = json!([]);
                t["timed_pollers"] = json!([]);
                t["paused_pollers"] = json!([]);
                t
            }))
        },
    );
    reg.bare_with(
        "thread_get_io_channels",
        RUNTIME,
        "Each reactor's I/O channels, in SPDK's layout (the lists are empty).",
        no_params,
        |ctx| async move {
            Ok(per_thread(&ctx, |_, mut t| {
                if let Some(o) = t.as_object_mut() {
                    o.remove("id"); // SPDK lists only the name here
                }
                t["io_channels"] = json!([]);
                t
            }))
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_spdk() {
        assert_eq!(thread_name(0, 3), "app_thread");
        assert_eq!(thread_name(1, 5), "reactor_5");
    }
}

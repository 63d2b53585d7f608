//! The method registry: JSON-RPC method names mapped to handlers that run on the first reactor,
//! plus the config writers of each subsystem (for `save_config`).

use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use ferrite_reactor::Engine;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a method returns: a JSON result or a JSON-RPC error.
pub type RpcResult = Result<Value, RpcError>;
/// A handler's future (runs on the first reactor; need not be `Send`).
pub type RpcFuture = Pin<Box<dyn Future<Output = RpcResult>>>;
/// A method implementation.
pub type Handler = Arc<dyn Fn(Ctx, Params) -> RpcFuture + Send + Sync>;
/// Produces a subsystem's config entries (`{"method":..,"params":..}`), in replay order.
pub type ConfigWriter = Arc<dyn Fn() -> Vec<Value> + Send + Sync>;

/// What every handler may use.
#[derive(Clone)]
pub struct Ctx {
    /// The reactors.
    pub engine: Engine,
    /// The registry itself (for introspection methods).
    pub registry: Arc<Registry>,
}

/// A request's `params` member.
#[derive(Debug, Clone, Default)]
pub struct Params(pub Option<Value>);

impl Params {
    /// Decodes the params into `T`; absent params decode as `{}`. A mismatch is an
    /// "Invalid parameters" error naming the problem.
    pub fn parse<T: DeserializeOwned>(self) -> Result<T, RpcError> {
        let v = self.0.unwrap_or_else(|| Value::Object(Default::default()));
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            // Name the offending field for type errors (serde names it itself for missing and
            // unknown fields).
            let msg = if path.is_empty() || path == "." { inner.to_string() } else { format!("{path}: {inner}") };
            RpcError::new(INVALID_PARAMS, format!("Invalid parameters: {msg}"))
        })
    }

    /// Fails unless there are no params (or an empty object).
    pub fn none(self) -> Result<(), RpcError> {
        match self.0 {
            None => Ok(()),
            Some(Value::Object(m)) if m.is_empty() => Ok(()),
            Some(_) => Err(RpcError::new(INVALID_PARAMS, "Invalid parameters: this method takes none")),
        }
    }
}

/// A subsystem, as `framework_get_subsystems` and `save_config` list it.
#[derive(Clone)]
pub struct Subsystem {
    /// Name, e.g. "bdev".
    pub name: &'static str,
    /// Subsystems it depends on.
    pub depends_on: Vec<&'static str>,
    /// Its config entries.
    pub config: ConfigWriter,
}

/// Registered methods and subsystems. Built once at startup, then shared read-only.
#[derive(Default)]
pub struct Registry {
    methods: BTreeMap<&'static str, Handler>,
    subsystems: Vec<Subsystem>,
}

/// Methods that SPDK writes into saved configs and Ferrite accepts without effect, so that a
/// config written by SPDK loads. (Any `*_set_options` method is accepted as well.)
pub const IGNORED_CONFIG_METHODS: &[&str] = &[
    "sock_set_default_impl",
    "bdev_nvme_set_hotplug",
    "nvmf_set_config",
    "nvmf_set_max_subsystems",
    "framework_set_scheduler",
    "vhost_blk_set_coalescing",
];

impl Registry {
    /// Adds a method; `f` receives the context and params.
    pub fn method<F, Fut>(&mut self, name: &'static str, f: F)
    where
        F: Fn(Ctx, Params) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        let prev = self.methods.insert(name, Arc::new(move |c, p| Box::pin(f(c, p))));
        assert!(prev.is_none(), "method {name} registered twice");
    }

    /// Adds a subsystem.
    pub fn subsystem(&mut self, s: Subsystem) {
        self.subsystems.push(s);
    }

    /// Names of every method, sorted.
    pub fn method_names(&self) -> Vec<&'static str> {
        self.methods.keys().copied().collect()
    }

    /// The subsystems, in registration order.
    pub fn subsystems(&self) -> &[Subsystem] {
        &self.subsystems
    }

    /// True if `method` is one of the SPDK config methods that Ferrite accepts and ignores.
    pub fn is_ignored(method: &str) -> bool {
        IGNORED_CONFIG_METHODS.contains(&method) || method.ends_with("_set_options")
    }

    /// Runs a method (on the calling reactor: the first one). Unknown methods fail with
    /// "Method not found"; SPDK's config-only methods are logged and succeed.
    pub fn call(ctx: &Ctx, method: &str, params: Params) -> RpcFuture {
        match ctx.registry.methods.get(method) {
            Some(h) => h(ctx.clone(), params),
            None if Self::is_ignored(method) => {
                log::info!("{method}: accepted for SPDK compatibility; Ferrite has no use for it, ignored");
                Box::pin(async { Ok(Value::Bool(true)) })
            }
            None => {
                let err = RpcError::method_not_found(method);
                Box::pin(async move { Err(err) })
            }
        }
    }
}

/// Maps an errno-style failure to SPDK's convention: code = -errno, with a readable message.
pub fn errno_error(errno: i32, message: impl Into<String>) -> RpcError {
    RpcError::new(-errno, message)
}

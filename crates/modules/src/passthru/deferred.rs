//! Virtual bdevs configured over a base bdev that is not registered (yet), kept as SPDK keeps
//! them: `bdev_passthru_create` (and delay's and error's create) over a missing base succeeds,
//! and the virtual bdev appears when the base registers (the module's examine). A configured
//! virtual bdev whose base is hot-removed appears again when the base comes back; its delete
//! method forgets it. The table is per engine.

use super::base::{stack_depth, MAX_STACK_DEPTH};
use ferrite_bdev::bdev::{check_name, lookup, Bdev, BdevError};
use std::sync::Arc;

type Make = Arc<dyn Fn() -> Result<Bdev, BdevError> + Send + Sync>;

struct Entry {
    module: &'static str,
    base: String,
    vbdev: String,
    make: Make,
}

#[derive(Default)]
struct Table(Vec<Entry>);

fn table() -> ferrite_reactor::StateGuard<Table> {
    ferrite_reactor::lock_state::<Table>()
}

/// Makes virtual bdev `vbdev` of `module` over `base` with `make` now, or, if `base` is not
/// registered, remembers it for when it is. True if made now.
pub(crate) fn create_or_defer(
    module: &'static str,
    base: &str,
    vbdev: &str,
    make: impl Fn() -> Result<Bdev, BdevError> + Send + Sync + 'static,
) -> Result<bool, BdevError> {
    check_name(vbdev)?;
    if table().0.iter().any(|e| e.vbdev == vbdev) || lookup(vbdev).is_some() {
        return Err(BdevError::Exists(vbdev.to_string()));
    }
    // Waiting virtual bdevs stack as registered ones do: the same depth limit (a base that
    // arrives registers the whole chain at once, one level inside the other).
    if depth_over(base, vbdev) >= MAX_STACK_DEPTH {
        return Err(BdevError::Invalid(format!(
            "bdev {base} already stands (or will stand) on {MAX_STACK_DEPTH} virtual bdevs; no deeper stacks"
        )));
    }
    let made = match make() {
        Ok(_) => true,
        Err(BdevError::NotFound(_)) if lookup(base).is_none() => {
            log::info!("{module}: {} waits for its base bdev {} to appear", vbdev.escape_debug(), base.escape_debug());
            false
        }
        Err(e) => return Err(e),
    };
    table().0.push(Entry { module, base: base.to_string(), vbdev: vbdev.to_string(), make: Arc::new(make) });
    Ok(made)
}

/// How many virtual bdevs `name` stands on, registered or waiting; a chain that leads back to
/// `new` (the virtual bdev being configured over it) is a cycle and counts as too deep.
fn depth_over(name: &str, new: &str) -> u32 {
    let t = table();
    let mut depth = 0;
    let mut name = name.to_string();
    while depth <= MAX_STACK_DEPTH {
        if name == new {
            return u32::MAX;
        }
        if let Some(b) = lookup(&name) {
            return depth + stack_depth(&b);
        }
        match t.0.iter().find(|e| e.vbdev == name) {
            Some(e) => {
                depth += 1;
                name = e.base.clone();
            }
            None => return depth,
        }
    }
    depth
}

/// The examine of `module`: makes its virtual bdevs configured over `bdev` (by name or alias)
/// that are not registered.
pub(crate) fn examine(module: &'static str, bdev: &Bdev) {
    let aliases = bdev.aliases();
    let names: Vec<&str> = std::iter::once(bdev.name()).chain(aliases.iter().map(String::as_str)).collect();
    let due: Vec<(String, Make)> = table()
        .0
        .iter()
        .filter(|e| e.module == module && names.contains(&e.base.as_str()))
        .map(|e| (e.vbdev.clone(), e.make.clone()))
        .collect();
    for (vbdev, make) in due {
        if let Some(other) = lookup(&vbdev) {
            if other.module() != module {
                log::warn!(
                    "{module}: cannot make {} over {}: a {} bdev has that name",
                    vbdev.escape_debug(),
                    bdev.name(),
                    other.module()
                );
            }
            continue;
        }
        match make() {
            Ok(_) => log::info!("{module}: made {} over {} at its arrival", vbdev.escape_debug(), bdev.name()),
            Err(e) => log::warn!("{module}: cannot make {} over {}: {e}", vbdev.escape_debug(), bdev.name()),
        }
    }
}

/// Forgets configured virtual bdev `vbdev` of `module` (its delete method). True if it was
/// configured but not registered (waiting for its base): then there is nothing else to delete.
pub(crate) fn forget(module: &'static str, vbdev: &str) -> bool {
    let mut t = table();
    let Some(i) = t.0.iter().position(|e| e.module == module && e.vbdev == vbdev) else { return false };
    t.0.remove(i);
    drop(t);
    // Not registered, or the name belongs to another module's bdev: it was only waiting.
    lookup(vbdev).is_none_or(|b| b.module() != module)
}

/// Virtual bdevs of `module` waiting for their base: (vbdev, base) names.
pub fn waiting(module: &'static str) -> Vec<(String, String)> {
    table()
        .0
        .iter()
        .filter(|e| e.module == module && lookup(&e.vbdev).is_none())
        .map(|e| (e.vbdev.clone(), e.base.clone()))
        .collect()
}

//! The method registry: JSON-RPC method names mapped to handlers that run on the first reactor,
//! each allowed in SPDK's RPC states (startup, runtime), plus the config writers of each
//! subsystem (for `save_config`).
//!
//! A method is registered with the type its params decode into ([`Registry::typed`]: the
//! handler receives it decoded; [`Registry::bare`] for none) and a one-line summary, so what
//! documents it ([`MethodDoc`]: the type's JSON schema, for [`crate::reference`]) is what the
//! handler really decodes.

use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use ferrite_reactor::Engine;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

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
    /// "Invalid parameters" error naming the problem. Params are named (an object), as SPDK
    /// takes them: positional params (an array) are refused as such.
    pub fn parse<T: DeserializeOwned>(self) -> Result<T, RpcError> {
        let v = self.0.unwrap_or_else(|| Value::Object(Default::default()));
        if !v.is_object() {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "Invalid parameters: params must be an object of named parameters",
            ));
        }
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

/// SPDK's RPC state before `framework_start_init` (`--wait-for-rpc`).
pub const STARTUP: u8 = 0x1;
/// SPDK's RPC state once the framework runs.
pub const RUNTIME: u8 = 0x4;
/// SPDK's error code for a method called in the wrong state.
pub const INVALID_STATE: i32 = -1;

struct Method {
    handler: Handler,
    states: u8,
    doc: MethodDoc,
}

/// Decodes a method's params into what its handler takes (the method's name is given for
/// error messages that name it).
pub type Decode<P> = fn(&'static str, Params) -> Result<P, RpcError>;

/// What a method takes and does, for `docs/RPC.md` and `ferrite rpc --help`.
#[derive(Clone)]
pub struct MethodDoc {
    /// One line: what the method does.
    pub summary: std::borrow::Cow<'static, str>,
    /// Its parameters.
    pub params: ParamsDoc,
    /// A call must give params (an object), even if none of its members is required.
    pub params_required: bool,
}

impl MethodDoc {
    /// The doc of a method whose params are those of `P` (for a handler that decodes them by
    /// hand, as `P` describes).
    pub fn of<P: schemars::JsonSchema>(summary: &'static str) -> MethodDoc {
        MethodDoc { summary: summary.into(), params: ParamsDoc::Schema(schema_of::<P>), params_required: false }
    }
}

/// A method's parameters, as its handler decodes them.
#[derive(Clone)]
pub enum ParamsDoc {
    /// It takes none.
    None,
    /// The JSON schema of the type its params decode into.
    Schema(fn() -> schemars::Schema),
    /// A table made by the registrant (SPDK's option methods: their schema fragment).
    Rows(Vec<crate::reference::ParamRow>),
}

/// The schema of `P` (a function per type, so the schema is made only when documented).
fn schema_of<P: schemars::JsonSchema>() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft2020_12().into_generator().into_root_schema_for::<P>()
}

/// [`Params::parse`] as a [`Decode`].
fn parse<P: DeserializeOwned>(_: &'static str, p: Params) -> Result<P, RpcError> {
    p.parse()
}

/// [`Params::none`] as a [`Decode`].
fn none(_: &'static str, p: Params) -> Result<(), RpcError> {
    p.none()
}

/// Registered methods and subsystems, the RPC state, and what option methods have set. Built
/// once at startup, then shared.
pub struct Registry {
    methods: BTreeMap<&'static str, Method>,
    subsystems: Vec<Subsystem>,
    state: AtomicU8,
    settings: crate::options::Settings,
    deferred: Mutex<Option<Value>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            methods: BTreeMap::new(),
            subsystems: Vec::new(),
            state: AtomicU8::new(STARTUP),
            settings: Default::default(),
            deferred: Mutex::new(None),
        }
    }
}

impl Registry {
    /// Adds a method callable at runtime (after `framework_start_init`), like most of SPDK's,
    /// whose params decode into `P` ([`Params::parse`]); `P`'s schema documents them.
    pub fn typed<P, F, Fut>(&mut self, name: &'static str, summary: &'static str, f: F)
    where
        P: DeserializeOwned + schemars::JsonSchema + 'static,
        F: Fn(Ctx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        self.typed_with(name, RUNTIME, summary, parse::<P>, f);
    }

    /// [`Registry::typed`] for a method callable in `states` ([`STARTUP`], [`RUNTIME`] or both).
    pub fn typed_in<P, F, Fut>(&mut self, name: &'static str, states: u8, summary: &'static str, f: F)
    where
        P: DeserializeOwned + schemars::JsonSchema + 'static,
        F: Fn(Ctx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        self.typed_with(name, states, summary, parse::<P>, f);
    }

    /// Adds a method callable in `states` whose params `decode` turns into `P` (for methods
    /// that answer bad params in their own words); `P`'s schema documents them.
    pub fn typed_with<P, F, Fut>(
        &mut self,
        name: &'static str,
        states: u8,
        summary: &'static str,
        decode: Decode<P>,
        f: F,
    ) where
        P: schemars::JsonSchema + 'static,
        F: Fn(Ctx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        let doc = MethodDoc::of::<P>(summary);
        self.raw(name, states, doc, move |c, p| {
            let fut = decode(name, p).map(|p| f(c, p));
            async move { fut?.await }
        });
    }

    /// Adds a method callable at runtime that takes no params ([`Params::none`]).
    pub fn bare<F, Fut>(&mut self, name: &'static str, summary: &'static str, f: F)
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        self.bare_with(name, RUNTIME, summary, none, f);
    }

    /// [`Registry::bare`] for a method callable in `states`.
    pub fn bare_in<F, Fut>(&mut self, name: &'static str, states: u8, summary: &'static str, f: F)
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        self.bare_with(name, states, summary, none, f);
    }

    /// Adds a method callable in `states` that takes no params, refused by `check` (for
    /// methods that answer params in their own words).
    pub fn bare_with<F, Fut>(&mut self, name: &'static str, states: u8, summary: &'static str, check: Decode<()>, f: F)
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        let doc = MethodDoc { summary: summary.into(), params: ParamsDoc::None, params_required: false };
        self.raw(name, states, doc, move |c, p| {
            let fut = check(name, p).map(|()| f(c));
            async move { fut?.await }
        });
    }

    /// Adds a method callable in `states` whose handler decodes its params itself, documented
    /// by `doc` (for the registry's own kinds of method, such as option methods).
    pub fn raw<F, Fut>(&mut self, name: &'static str, states: u8, doc: MethodDoc, f: F)
    where
        F: Fn(Ctx, Params) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RpcResult> + 'static,
    {
        let handler: Handler = Arc::new(move |c, p| Box::pin(f(c, p)));
        let prev = self.methods.insert(name, Method { handler, states, doc });
        assert!(prev.is_none(), "method {name} registered twice");
    }

    /// Adds an SPDK option method, as the crate that owns its options defines it: the method
    /// itself (decoded by SPDK's schema, checked by SPDK's defaults and the members the crate
    /// acts on, kept for `save_config`), in its subsystem's config. Panics if the definition is
    /// invalid ([`crate::options::OptionMethod::validate`] tells why) or the method exists.
    pub fn option_method(&mut self, def: &'static crate::options::OptionMethod) {
        crate::options::add(self, def);
    }

    /// Adds a subsystem.
    pub fn subsystem(&mut self, s: Subsystem) {
        self.subsystems.push(s);
    }

    /// Names of every method, sorted.
    pub fn method_names(&self) -> Vec<&'static str> {
        self.methods.keys().copied().collect()
    }

    /// Names of the methods callable in the current state, sorted.
    pub fn current_method_names(&self) -> Vec<&'static str> {
        let st = self.state();
        self.methods.iter().filter(|(_, m)| m.states & st == st).map(|(n, _)| *n).collect()
    }

    /// The states `method` may be called in, if it exists.
    pub fn states_of(&self, method: &str) -> Option<u8> {
        self.methods.get(method).map(|m| m.states)
    }

    /// What documents `method`, if it exists.
    pub fn doc_of(&self, method: &str) -> Option<&MethodDoc> {
        self.methods.get(method).map(|m| &m.doc)
    }

    /// The subsystems, in registration order.
    pub fn subsystems(&self) -> &[Subsystem] {
        &self.subsystems
    }

    /// A subsystem's config entries: what option methods set in it, then its own entries.
    pub fn subsystem_config(&self, s: &Subsystem) -> Vec<Value> {
        let mut v = self.settings.entries(s.name);
        v.extend((s.config)());
        v
    }

    /// The current RPC state ([`STARTUP`] or [`RUNTIME`]).
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::SeqCst)
    }

    /// Moves to `state`.
    pub fn set_state(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
    }

    /// What option methods have set.
    pub fn settings(&self) -> &crate::options::Settings {
        &self.settings
    }

    /// The option methods, to register one.
    pub(crate) fn settings_mut(&mut self) -> &mut crate::options::Settings {
        &mut self.settings
    }

    /// Keeps (or takes back) a config whose runtime entries wait for `framework_start_init`.
    pub fn defer_config(&self, doc: Option<Value>) -> Option<Value> {
        std::mem::replace(&mut *self.deferred.lock().unwrap_or_else(|e| e.into_inner()), doc)
    }

    /// Runs a method (on the calling reactor: the first one). Unknown methods fail with
    /// "Method not found"; a method not allowed in the current state fails like SPDK's (-1).
    pub fn call(ctx: &Ctx, method: &str, params: Params) -> RpcFuture {
        let res = match ctx.registry.methods.get(method) {
            None => Err(RpcError::method_not_found(method)),
            Some(m) => {
                let st = ctx.registry.state();
                if m.states & st == st {
                    return (m.handler)(ctx.clone(), params);
                } else if st == STARTUP {
                    Err(RpcError::new(
                        INVALID_STATE,
                        "Method may only be called after framework is initialized using framework_start_init RPC.",
                    ))
                } else {
                    Err(RpcError::new(
                        INVALID_STATE,
                        "Method may only be called before framework is initialized. Use --wait-for-rpc command \
                         line parameter and then issue this RPC before the framework_start_init RPC.",
                    ))
                }
            }
        };
        Box::pin(async move { res })
    }
}

/// Maps an errno-style failure to SPDK's convention: code = -errno, with a readable message.
pub fn errno_error(errno: i32, message: impl Into<String>) -> RpcError {
    RpcError::new(-errno, message)
}

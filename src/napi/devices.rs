//! Devices and llama.cpp's RPC backend: `listDevices`, `serveRpc`, the placement options of
//! `createContext` (`nGpuLayers`, `mainGpu`, `splitMode`, `tensorSplit`, `devices`,
//! `rpcServers`), and the watchdog that declares contexts lost when an RPC server dies.
//!
//! Faults. ggml-rpc keeps one connection (a "dispatcher" thread) per endpoint per process and
//! calls GGML_ABORT on it when the server dies or answers garbage, while the thread decoding
//! waits for it forever. Our abort hook (llama/devices.rs) runs on that thread before `abort()`:
//! it hands the message to the watchdog and parks the thread for good. The watchdog probes the
//! endpoints in use, marks the dead ones as unusable for the rest of the process (the parked
//! dispatcher is still the one ggml would reuse), and declares every context (and load) that
//! uses one lost: their promises reject with `ERR_CONTEXT_LOST` at once, later calls fail the
//! same way. The cost: the parked dispatcher thread, the worker thread stuck in the decode, and
//! the lost context's memory (KV cache, compute buffers, its model's local weights) stay
//! allocated until the process exits. Other contexts keep working.

use std::collections::HashSet;
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use napi_derive::napi;

use super::convert::{int_in, js, Result};
use super::worker::Losable;
use crate::engine::endpoint::Endpoint;
use crate::engine::placement::{self, PlacementRequest};
use crate::error::Error;
use crate::llama::{self, Device, DeviceKind, ModelParams, SplitMode};

/// How long a server may take to accept a TCP connection before it counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `listDevices` waits for the servers' answers.
const LIST_TIMEOUT: Duration = Duration::from_secs(15);

/// A backend device, from {@link listDevices}.
#[napi(object)]
pub struct DeviceDescription {
    /// The name `devices` takes, e.g. `'CPU'`, `'Vulkan0'`, `'RPC0'`.
    pub name: String,
    /// For an RPC device: its server's `host:port`.
    pub description: String,
    #[napi(ts_type = "'cpu' | 'gpu' | 'rpc'")]
    pub r#type: String,
    /// Bytes (as the backend reports them; for the CPU and RPC CPU devices, the host's RAM).
    pub memory_free: f64,
    pub memory_total: f64,
}

#[napi(object)]
pub struct ListDevicesOptions {
    /// Also list the devices of these RPC servers (probed first; same errors as in {@link ContextOptions.rpcServers}).
    pub rpc_servers: Option<Vec<String>>,
}

#[napi(object)]
pub struct ServeRpcOptions {
    /// Address to bind. Default `'127.0.0.1'`; anything but loopback needs `allowRemote`.
    pub host: Option<String>,
    pub port: f64,
    /// CPU threads for the server's computations. Default: all cores.
    pub threads: Option<f64>,
    /// Folder where the server caches tensors by hash, so clients reload faster.
    pub cache_dir: Option<String>,
    /// Allow a non-loopback `host`. The RPC protocol has NO authentication or encryption.
    pub allow_remote: Option<bool>,
}

#[napi(object)]
pub struct RpcServerInfo {
    pub endpoint: String,
    /// The local devices it serves (the GPUs, else the CPU).
    pub devices: Vec<String>,
}

/// Where a context's layers went ({@link SessionContext.offload}).
#[napi(object)]
#[derive(Clone)]
pub struct OffloadInfo {
    /// Layers on GPU / RPC devices (the output layer counts as one, as in llama.cpp's log).
    pub layers: u32,
    /// The model's layers + 1.
    pub total_layers: u32,
    /// The devices that took layers, in order (empty: CPU only).
    pub devices: Vec<String>,
}

fn describe(d: Device) -> DeviceDescription {
    let info = d.info();
    DeviceDescription {
        name: info.name,
        description: info.description,
        r#type: info.kind.as_str().to_string(),
        memory_free: info.memory_free as f64,
        memory_total: info.memory_total as f64,
    }
}

// ---------------------------------------------------------------------------------------------
// RPC endpoints: parsed, probed, registered once, and remembered when they die.

/// What this process knows of RPC endpoints and who uses them, behind one lock (never held
/// across a call into ggml: the abort hook may run on the calling thread).
#[derive(Default)]
struct Registry {
    /// Endpoints whose server failed: ggml keeps their parked dispatcher, so they can never be
    /// used again in this process.
    dead: HashSet<Endpoint>,
    /// Every endpoint handed to ggml.
    added: HashSet<Endpoint>,
    /// Contexts and loads to declare lost when one of their endpoints fails.
    watches: Vec<Watch>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    lock(REGISTRY.get_or_init(Default::default))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn parse_endpoints(list: &[String]) -> crate::error::Result<Vec<Endpoint>> {
    if list.len() > 16 {
        return Err(Error::invalid(
            "rpcServers: at most 16 servers (GGML_RPC_MAX_SERVERS)",
        ));
    }
    let mut out: Vec<Endpoint> = Vec::new();
    for text in list {
        let e = Endpoint::parse(text)?;
        if out.contains(&e) {
            return Err(Error::invalid(format!("rpcServers lists {e} twice")));
        }
        out.push(e);
    }
    Ok(out)
}

/// Whether every one of `endpoints` still has a server (not dead in this process, not refusing
/// connections): freeing buffers there can complete (see `Model::set_free_check`). A server
/// that hangs without closing its socket still counts as answering.
pub fn servers_answer(endpoints: &[Endpoint]) -> bool {
    // The registry is not held across the probes (each may take PROBE_TIMEOUT).
    let dead = registry().dead.clone();
    endpoints
        .iter()
        .all(|e| !dead.contains(e) && !e.refuses(PROBE_TIMEOUT))
}

/// Probes each endpoint and hands it to ggml; its devices, in order.
fn connect(endpoints: &[Endpoint]) -> crate::error::Result<Vec<Device>> {
    if !endpoints.is_empty() && !llama::rpc_available() {
        return Err(Error::Unsupported(
            "this build of llama-branch has no RPC backend".into(),
        ));
    }
    install_watchdog();
    let mut devices = Vec::new();
    for e in endpoints {
        if registry().dead.contains(e) {
            return Err(Error::RpcUnreachable(format!(
                "{e} failed earlier in this process; ggml-rpc keeps one connection per endpoint \
                 for the life of the process, so it cannot be used again here (restart the \
                 process, or start the server on another port)"
            )));
        }
        // A server serves one client connection at a time, and a context of this process that
        // uses it holds that connection: a probe would only wait in its (tiny) accept queue.
        // ggml reuses the held connection, and a failure on it is caught by the abort hook.
        if !connected(e) {
            e.probe(PROBE_TIMEOUT)?;
            // The server serves one connection at a time from an accept queue of one (ggml-rpc's
            // listen backlog): give it a moment to finish with the probe before ggml connects.
            std::thread::sleep(Duration::from_millis(100));
        }
        registry().added.insert(e.clone());
        devices.extend(llama::rpc_add_server(&e.to_string())?);
    }
    Ok(devices)
}

// ---------------------------------------------------------------------------------------------
// The watchdog.

struct Watch {
    endpoints: Vec<Endpoint>,
    target: Weak<dyn Losable>,
}

/// Whether a live context (or load) of this process uses `e`, and so holds ggml's connection.
fn connected(e: &Endpoint) -> bool {
    registry()
        .watches
        .iter()
        .any(|w| w.target.strong_count() > 0 && w.endpoints.contains(e))
}

/// Declares `target` lost when one of `endpoints` fails (for as long as `target` lives).
pub fn watch(endpoints: &[Endpoint], target: Weak<dyn Losable>) {
    if endpoints.is_empty() {
        return;
    }
    let mut registry = registry();
    registry.watches.retain(|w| w.target.strong_count() > 0);
    registry.watches.push(Watch {
        endpoints: endpoints.to_vec(),
        target,
    });
}

/// A one-shot action run when a watched load is lost (it fails the load's promise).
type LostAction = Box<dyn FnOnce(&str) + Send>;

pub struct OnLost(Mutex<Option<LostAction>>);

impl OnLost {
    pub fn new(f: impl FnOnce(&str) + Send + 'static) -> Arc<OnLost> {
        Arc::new(OnLost(Mutex::new(Some(Box::new(f)))))
    }
}

impl Losable for OnLost {
    fn mark_lost(&self, reason: &str) {
        if let Some(f) = lock(&self.0).take() {
            f(reason)
        }
    }
}

/// The watchdog's inbox: set once, and needing no lock (the abort hook may fire on a thread that
/// is inside any other lock of ours).
static FAILURES: OnceLock<mpsc::Sender<String>> = OnceLock::new();

/// Called by the abort hook on the failing thread (which is parked right after).
fn on_rpc_abort(message: String) {
    if let Some(tx) = FAILURES.get() {
        let _ = tx.send(message);
    }
}

fn install_watchdog() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let (tx, rx) = mpsc::channel::<String>();
        let _ = FAILURES.set(tx);
        let spawned = std::thread::Builder::new()
            .name("llama-branch-rpc-watchdog".into())
            .spawn(move || {
                while let Ok(message) = rx.recv() {
                    handle_failure(&message);
                }
            });
        if spawned.is_ok() {
            llama::install_abort_hook(on_rpc_abort);
        }
    });
}

fn handle_failure(message: &str) {
    let message = message.trim();
    let in_use: Vec<Endpoint> = registry().added.iter().cloned().collect();
    // The message does not name the endpoint: the dead server is the one that refuses
    // connections now. (A live server busy with our own connection lets a probe wait in its
    // accept queue or time out: that is not a death.)
    // A killed server's connections can close a moment before its listening socket: look again
    // for up to a second before concluding that none refuses.
    let mut failed: Vec<Endpoint> = Vec::new();
    for _ in 0..10 {
        failed = in_use
            .iter()
            .filter(|e| e.refuses(PROBE_TIMEOUT))
            .cloned()
            .collect();
        if !failed.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if failed.is_empty() {
        // Alive but answering garbage (or it restarted): which one is unknown, so all are.
        failed = in_use;
    }
    registry().dead.extend(failed.iter().cloned());
    let names: Vec<String> = failed.iter().map(|e| e.to_string()).collect();
    let reason = format!("RPC server {} failed ({message})", names.join(", "));
    let targets: Vec<Arc<dyn Losable>> = registry()
        .watches
        .iter()
        .filter(|w| w.endpoints.iter().any(|e| failed.contains(e)))
        .filter_map(|w| w.target.upgrade())
        .collect();
    for t in targets {
        t.mark_lost(&reason);
    }
}

// ---------------------------------------------------------------------------------------------
// Placement options of createContext.

/// The placement options as JS passed them (fields of `ContextOptions`).
pub struct PlacementInput<'a> {
    pub n_gpu_layers: Option<f64>,
    pub main_gpu: Option<f64>,
    pub split_mode: Option<&'a str>,
    pub tensor_split: Option<&'a [f64]>,
    pub devices: Option<&'a [String]>,
    pub rpc_servers: Option<&'a [String]>,
}

/// Placement checked on the JS thread (shapes and ranges that need no model or server); the
/// rules that need the devices and the model are `engine::placement::plan`.
#[derive(Clone)]
pub struct Placement {
    request: PlacementRequest,
    split_mode: SplitMode,
    pub endpoints: Vec<Endpoint>,
}

pub fn resolve_placement(p: &PlacementInput) -> crate::error::Result<Placement> {
    let n_gpu_layers = p
        .n_gpu_layers
        .map(|v| int_in("nGpuLayers", v, 0, 100_000).map(|n| n as u32))
        .transpose()?;
    let main_gpu = p
        .main_gpu
        .map(|v| int_in("mainGpu", v, 0, 255).map(|n| n as u32))
        .transpose()?
        .unwrap_or(0);
    let split_mode = match p.split_mode {
        None | Some("layer") => SplitMode::Layer,
        Some("none") => SplitMode::None,
        Some("row") => SplitMode::Row,
        Some(other) => {
            return Err(Error::invalid(format!(
                "splitMode must be 'none', 'layer' or 'row', got {other:?}"
            )))
        }
    };
    // An empty list is no offload device at all: the CPU alone, even with a GPU present
    // (`createContext({ gpu: false })`); omitting it is llama.cpp's default, every local GPU.
    let devices = p.devices.map(|d| d.to_vec());
    Ok(Placement {
        request: PlacementRequest {
            n_gpu_layers,
            main_gpu,
            tensor_split: placement::tensor_split(p.tensor_split.unwrap_or(&[]))?,
            devices,
        },
        split_mode,
        endpoints: parse_endpoints(p.rpc_servers.unwrap_or(&[]))?,
    })
}

impl Placement {
    /// A key for the model cache: contexts share a model only when it is placed the same way.
    pub fn key(&self) -> String {
        format!(
            "{:?}|{:?}|{:?}",
            self.request, self.split_mode, self.endpoints
        )
    }

    /// Connects the RPC servers and plans the placement on the devices found (on the loader
    /// thread: probes and handshakes may take a moment). `block_count` is the model's layer
    /// count from its GGUF header.
    pub fn model_params(
        &self,
        use_mmap: bool,
        repack_weights: bool,
        block_count: u32,
    ) -> crate::error::Result<(ModelParams, OffloadInfo)> {
        let remote = connect(&self.endpoints)?;
        let plan = placement::plan(&self.request, &llama::local_devices(), &remote, block_count)?;
        let offload = OffloadInfo {
            layers: plan.n_gpu_layers.min(plan.total_layers),
            total_layers: plan.total_layers,
            devices: plan.offload_devices,
        };
        Ok((
            ModelParams {
                use_mmap,
                n_gpu_layers: plan.n_gpu_layers as i32,
                devices: plan.devices,
                split_mode: self.split_mode,
                main_gpu: self.request.main_gpu as i32,
                tensor_split: self.request.tensor_split.clone(),
                repack_weights,
            },
            offload,
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Module functions.

/// The backend devices of this process (CPU, GPUs) and, with `rpcServers`, those of each server
/// (probed first; memory as the server reports it). Synchronous; with servers it waits for
/// their answers (at most 15 s).
#[napi(js_name = "listDevices")]
pub fn list_devices(options: Option<ListDevicesOptions>) -> Result<Vec<DeviceDescription>> {
    let endpoints = parse_endpoints(
        options
            .and_then(|o| o.rpc_servers)
            .as_deref()
            .unwrap_or(&[]),
    )
    .map_err(js)?;
    let mut out: Vec<DeviceDescription> =
        llama::local_devices().into_iter().map(describe).collect();
    if endpoints.is_empty() {
        return Ok(out);
    }
    // On a helper thread: if a server dies between the probe and the query, ggml-rpc parks that
    // thread (see the module comment), and this call still returns.
    let (tx, rx) = mpsc::channel();
    let probe = endpoints.clone();
    std::thread::Builder::new()
        .name("llama-branch-list-devices".into())
        .spawn(move || {
            let result =
                connect(&probe).map(|devs| devs.into_iter().map(describe).collect::<Vec<_>>());
            let _ = tx.send(result);
        })
        .map_err(|e| js(Error::Internal(format!("cannot start a thread: {e}"))))?;
    match rx.recv_timeout(LIST_TIMEOUT) {
        Ok(result) => out.extend(result.map_err(js)?),
        Err(_) => {
            return Err(js(Error::RpcUnreachable(format!(
                "{} did not answer within {} s",
                endpoints
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                LIST_TIMEOUT.as_secs()
            ))))
        }
    }
    Ok(out)
}

/// Runs llama.cpp's RPC server on this process's devices (its GPUs, else the CPU) on a thread of
/// its own, for the rest of the process: it cannot be stopped, and it does not keep Node's event
/// loop alive. The protocol has no authentication: anything but a loopback host needs
/// `allowRemote: true`.
#[napi(js_name = "serveRpc")]
pub fn serve_rpc(options: ServeRpcOptions) -> Result<RpcServerInfo> {
    let host = options.host.unwrap_or_else(|| "127.0.0.1".into());
    let port = int_in("port", options.port, 1, 65535).map_err(js)?;
    let endpoint = Endpoint::parse(&format!("{host}:{port}")).map_err(js)?;
    if !endpoint.is_loopback() && !options.allow_remote.unwrap_or(false) {
        return Err(js(Error::invalid(format!(
            "serveRpc: host {host} is not loopback. llama.cpp's RPC protocol has no \
             authentication or encryption: anyone who can reach the port can run code-sized \
             workloads and read or write the server's buffers. Pass allowRemote: true only on \
             a trusted network"
        ))));
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads = options
        .threads
        .map(|t| int_in("threads", t, 1, 1024))
        .transpose()
        .map_err(js)?
        .map_or(cores, |t| t as usize);
    if let Some(dir) = &options.cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            js(Error::invalid(format!(
                "cacheDir {dir:?} cannot be created: {e}"
            )))
        })?;
    }
    if !llama::rpc_available() {
        return Err(js(Error::Unsupported(
            "this build of llama-branch has no RPC backend".into(),
        )));
    }
    let local = llama::local_devices();
    let gpus: Vec<Device> = local
        .iter()
        .copied()
        .filter(|d| d.kind() == DeviceKind::Gpu)
        .collect();
    let devices = if gpus.is_empty() {
        local
            .iter()
            .copied()
            .filter(|d| d.kind() == DeviceKind::Cpu)
            .take(1)
            .collect()
    } else {
        gpus
    };
    // ggml reports a failed bind only on stdout; check the port is free first.
    std::net::TcpListener::bind((endpoint.host.as_str(), endpoint.port)).map_err(|e| {
        js(Error::invalid(format!(
            "serveRpc: cannot listen on {endpoint}: {e}"
        )))
    })?;
    let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
    let text = endpoint.to_string();
    let cache_dir = options.cache_dir.clone();
    std::thread::Builder::new()
        .name("llama-branch-rpc-server".into())
        .spawn(move || {
            if let Err(e) = llama::rpc_start_server(&text, cache_dir.as_deref(), threads, &devices)
            {
                eprintln!("llama-branch rpc server on {text}: {e}");
            } else {
                eprintln!("llama-branch rpc server on {text} stopped");
            }
        })
        .map_err(|e| js(Error::Internal(format!("cannot start a thread: {e}"))))?;
    Ok(RpcServerInfo {
        endpoint: endpoint.to_string(),
        devices: names,
    })
}

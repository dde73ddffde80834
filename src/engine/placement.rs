//! Where a model's layers go: the placement options of `createContext` (`nGpuLayers`,
//! `mainGpu`, `tensorSplit`, `devices`) checked against the devices there are and the model's
//! layer count. Plain rules over a device list, so they are unit-tested with fake devices; the
//! napi layer (napi/devices.rs) finds the real devices and connects RPC servers.

use crate::error::{Error, Result};

/// What placement needs to know of a device (implemented by `llama::Device` and by test fakes).
pub trait PlacedDevice: Copy + PartialEq {
    fn name(&self) -> String;
    fn is_cpu(&self) -> bool;
    fn is_gpu(&self) -> bool;
}

impl PlacedDevice for crate::llama::Device {
    fn name(&self) -> String {
        crate::llama::Device::name(*self)
    }
    fn is_cpu(&self) -> bool {
        self.kind() == crate::llama::DeviceKind::Cpu
    }
    fn is_gpu(&self) -> bool {
        self.kind() == crate::llama::DeviceKind::Gpu
    }
}

/// The placement options, their shapes already checked.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PlacementRequest {
    pub n_gpu_layers: Option<u32>,
    pub main_gpu: u32,
    pub tensor_split: Vec<f32>,
    /// Device names, in order; None for llama.cpp's default choice.
    pub devices: Option<Vec<String>>,
}

/// Where the layers go.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<D> {
    /// The devices to give llama.cpp (None: its default, every local GPU).
    pub devices: Option<Vec<D>>,
    /// Layers offloaded (0 when no device takes layers).
    pub n_gpu_layers: u32,
    /// The model's layers plus its output layer.
    pub total_layers: u32,
    /// Names of the devices that take layers, in order (empty: CPU only).
    pub offload_devices: Vec<String>,
}

/// `tensorSplit` as fractions: finite, non-negative, with a positive sum (or empty).
pub fn tensor_split(values: &[f64]) -> Result<Vec<f32>> {
    if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(Error::Device(
            "tensorSplit values must be finite and non-negative".into(),
        ));
    }
    if !values.is_empty() && values.iter().sum::<f64>() <= 0.0 {
        return Err(Error::Device("tensorSplit must have a positive sum".into()));
    }
    Ok(values.iter().map(|&v| v as f32).collect())
}

/// `devices` by name among `all` (case-insensitive): GPU or RPC devices, each once.
fn choose<D: PlacedDevice>(names: &[String], all: &[D]) -> Result<Vec<D>> {
    let mut out = Vec::new();
    for name in names {
        let d = all
            .iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .copied()
            .ok_or_else(|| {
                Error::Device(format!(
                    "unknown device {name:?}; listDevices() names the devices ({})",
                    all.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
                ))
            })?;
        if d.is_cpu() {
            return Err(Error::Device(format!(
                "device {name:?} is the CPU, which always holds the layers not offloaded; list \
                 only GPU and RPC devices"
            )));
        }
        if out.contains(&d) {
            return Err(Error::Device(format!("devices lists {name:?} twice")));
        }
        out.push(d);
    }
    Ok(out)
}

/// Plans the placement of a model of `block_count` layers on the `local` devices of this
/// process and the `remote` devices of its RPC servers.
pub fn plan<D: PlacedDevice>(
    req: &PlacementRequest,
    local: &[D],
    remote: &[D],
    block_count: u32,
) -> Result<Plan<D>> {
    let local_gpus = || local.iter().copied().filter(|d| d.is_gpu());
    let chosen: Option<Vec<D>> = match &req.devices {
        Some(names) => {
            let all: Vec<D> = local.iter().chain(remote).copied().collect();
            Some(choose(names, &all)?)
        }
        // RPC servers given without devices: every local GPU, then the servers' devices.
        None if !remote.is_empty() => Some(local_gpus().chain(remote.iter().copied()).collect()),
        None => None,
    };
    let offload: Vec<D> = chosen.clone().unwrap_or_else(|| local_gpus().collect());
    let total = block_count + 1;
    if let Some(n) = req.n_gpu_layers.filter(|&n| n > total) {
        return Err(Error::Device(format!(
            "nGpuLayers is {n} but the model has {block_count} layers plus the output layer; \
             use 0..={total}"
        )));
    }
    let names: Vec<String> = offload.iter().map(|d| d.name()).collect();
    if !req.tensor_split.is_empty() && req.tensor_split.len() != offload.len() {
        return Err(Error::Device(format!(
            "tensorSplit has {} entries but {} devices take layers ({}); give one fraction per \
             device",
            req.tensor_split.len(),
            offload.len(),
            names.join(", ")
        )));
    }
    if (req.main_gpu as usize) >= offload.len().max(1) {
        return Err(Error::Device(format!(
            "mainGpu is {} but there are {} offload devices",
            req.main_gpu,
            offload.len()
        )));
    }
    let n_gpu_layers = if offload.is_empty() {
        0
    } else {
        req.n_gpu_layers.unwrap_or(total)
    };
    Ok(Plan {
        devices: chosen,
        n_gpu_layers,
        total_layers: total,
        offload_devices: if n_gpu_layers == 0 { Vec::new() } else { names },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, PartialEq, Debug)]
    struct Fake(&'static str, char);

    impl PlacedDevice for Fake {
        fn name(&self) -> String {
            self.0.to_string()
        }
        fn is_cpu(&self) -> bool {
            self.1 == 'c'
        }
        fn is_gpu(&self) -> bool {
            self.1 == 'g'
        }
    }

    const CPU: Fake = Fake("CPU", 'c');
    const GPU0: Fake = Fake("Vulkan0", 'g');
    const GPU1: Fake = Fake("Vulkan1", 'g');
    const RPC0: Fake = Fake("RPC0[127.0.0.1:50052]", 'r');

    fn req(f: impl FnOnce(&mut PlacementRequest)) -> PlacementRequest {
        let mut r = PlacementRequest::default();
        f(&mut r);
        r
    }

    fn message<D: std::fmt::Debug>(r: Result<D>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn cpu_only_offloads_nothing_whatever_n_gpu_layers_says() {
        let p = plan(&req(|r| r.n_gpu_layers = Some(5)), &[CPU], &[], 18).unwrap();
        assert_eq!((p.devices, p.n_gpu_layers, p.total_layers), (None, 0, 19));
        assert!(p.offload_devices.is_empty());
    }

    #[test]
    fn local_gpus_take_every_layer_by_default_and_n_gpu_layers_caps_it() {
        let p = plan(&PlacementRequest::default(), &[CPU, GPU0, GPU1], &[], 18).unwrap();
        assert_eq!(p.devices, None, "llama.cpp's default choice");
        assert_eq!(p.n_gpu_layers, 19);
        assert_eq!(p.offload_devices, vec!["Vulkan0", "Vulkan1"]);
        let p = plan(&req(|r| r.n_gpu_layers = Some(4)), &[CPU, GPU0], &[], 18).unwrap();
        assert_eq!(p.n_gpu_layers, 4);
        let p = plan(&req(|r| r.n_gpu_layers = Some(0)), &[CPU, GPU0], &[], 18).unwrap();
        assert!(
            p.offload_devices.is_empty(),
            "no layers: no offload devices reported"
        );
        assert!(message(plan(
            &req(|r| r.n_gpu_layers = Some(20)),
            &[CPU, GPU0],
            &[],
            18
        ))
        .contains("use 0..=19"));
    }

    #[test]
    fn rpc_servers_add_their_devices_after_the_local_gpus() {
        let p = plan(&PlacementRequest::default(), &[CPU, GPU0], &[RPC0], 18).unwrap();
        assert_eq!(p.devices, Some(vec![GPU0, RPC0]));
        assert_eq!(p.offload_devices, vec!["Vulkan0", "RPC0[127.0.0.1:50052]"]);
    }

    #[test]
    fn devices_by_name_in_order_never_the_cpu_never_twice() {
        let names =
            |v: &[&str]| req(|r| r.devices = Some(v.iter().map(|s| s.to_string()).collect()));
        let p = plan(
            &names(&["vulkan1", "RPC0[127.0.0.1:50052]"]),
            &[CPU, GPU0, GPU1],
            &[RPC0],
            18,
        )
        .unwrap();
        assert_eq!(p.devices, Some(vec![GPU1, RPC0]));
        assert!(message(plan(&names(&["Metal"]), &[CPU, GPU0], &[], 18))
            .contains("unknown device \"Metal\"; listDevices() names the devices (CPU, Vulkan0)"));
        assert!(message(plan(&names(&["CPU"]), &[CPU, GPU0], &[], 18)).contains("is the CPU"));
        assert!(
            message(plan(&names(&["Vulkan0", "vulkan0"]), &[CPU, GPU0], &[], 18)).contains("twice")
        );
    }

    #[test]
    fn tensor_split_and_main_gpu_must_fit_the_offload_devices() {
        let split = |v: Vec<f32>| req(|r| r.tensor_split = v);
        assert!(plan(&split(vec![1.0, 3.0]), &[CPU, GPU0, GPU1], &[], 18).is_ok());
        assert!(
            message(plan(&split(vec![1.0]), &[CPU, GPU0, GPU1], &[], 18))
                .contains("tensorSplit has 1 entries but 2 devices take layers (Vulkan0, Vulkan1)")
        );
        assert!(plan(&req(|r| r.main_gpu = 1), &[CPU, GPU0, GPU1], &[], 18).is_ok());
        assert!(
            message(plan(&req(|r| r.main_gpu = 2), &[CPU, GPU0, GPU1], &[], 18))
                .contains("mainGpu is 2 but there are 2")
        );
        assert!(
            plan(&req(|r| r.main_gpu = 0), &[CPU], &[], 18).is_ok(),
            "mainGpu 0 is always valid"
        );
    }

    #[test]
    fn tensor_split_values_are_checked() {
        assert_eq!(tensor_split(&[1.0, 0.0]).unwrap(), vec![1.0, 0.0]);
        assert!(tensor_split(&[]).unwrap().is_empty());
        assert!(tensor_split(&[-1.0]).is_err());
        assert!(tensor_split(&[f64::NAN]).is_err());
        assert!(tensor_split(&[0.0, 0.0])
            .unwrap_err()
            .to_string()
            .contains("positive sum"));
    }
}

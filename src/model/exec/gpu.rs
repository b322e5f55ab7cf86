//! Opening a GPU for the burn executor (`--device gpu`): burn's wgpu
//! runtime pinned to Vulkan, so kernels compile to SPIR-V on every vendor's
//! driver and on Mesa's software one (lavapipe, the tests' device).
//!
//! Each rank of a host takes its own discrete GPU (the rank's index among
//! the host's ranks); a host with fewer discrete GPUs than ranks, or with
//! none (lavapipe), shares the adapter wgpu prefers, with a warning.

use std::sync::OnceLock;

use burn::tensor::wgpu::WgpuBackend;
use burn::tensor::{Device, DeviceKind};

use super::DeviceError;

/// The Vulkan device of the rank whose index on its host is `local_rank`.
/// burn registers a wgpu runtime once per process and refuses a second
/// registration, so the first opening is kept for every later executor of
/// the process (a process is one rank: its local rank does not change).
pub fn open(local_rank: usize) -> Result<Device, DeviceError> {
    static OPENED: OnceLock<Result<Device, String>> = OnceLock::new();
    OPENED
        .get_or_init(|| open_once(local_rank).map_err(|e| e.0))
        .clone()
        .map_err(DeviceError)
}

fn open_once(local_rank: usize) -> Result<Device, DeviceError> {
    let init = |kind: DeviceKind| {
        Device::wgpu_options()
            .device_kind(kind)
            .graphics_api(WgpuBackend::Vulkan)
            .init()
    };
    if local_rank > 0 {
        match init(DeviceKind::DiscreteGpu(local_rank)) {
            Ok(device) => {
                log::info!("--device gpu: discrete GPU {local_rank} (this rank's index on its host)");
                return Ok(device);
            }
            Err(e) => log::warn!(
                "--device gpu: no discrete GPU {local_rank} for this rank ({e}); sharing the default adapter"
            ),
        }
    }
    init(DeviceKind::DefaultDevice).map_err(|e| {
        DeviceError(format!(
            "--device gpu: no Vulkan adapter could be opened ({e}); install the GPU's Vulkan driver \
             (or Mesa's lavapipe, Debian's mesa-vulkan-drivers) and the loader (libvulkan1)"
        ))
    })
}

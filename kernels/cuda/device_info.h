// kernels/cuda/device_info.h: what CUDA runtime and devices this process can see.
// Host-only header (no CUDA types), so C++ code built by the host compiler can include it.
#ifndef KVGUARD_KERNELS_CUDA_DEVICE_INFO_H_
#define KVGUARD_KERNELS_CUDA_DEVICE_INFO_H_

#include <string>

namespace kvguard::kernels::cuda {

// DeviceCount returns the number of usable CUDA devices; 0 when there is no driver or no
// device (never an error: CPU paths run without CUDA).
int DeviceCount();

// NoDeviceReason returns why DeviceCount() is 0 (the CUDA runtime's message), or "" if a
// device exists. Tests print it when they skip.
std::string NoDeviceReason();

// DeviceSummary returns one line: CUDA runtime version, compiled architectures, and the
// devices found (or why none was).
std::string DeviceSummary();

}  // namespace kvguard::kernels::cuda

#endif  // KVGUARD_KERNELS_CUDA_DEVICE_INFO_H_

// The statistics of the allocator behind a TensorFlow device (bytes in use, its
// peak), as TensorFlow's own tf.config.experimental.get_memory_info reads them:
// the device's allocator, GetStats and ClearStats. The C API has no such call,
// so this file reaches the device through the C API's handles with the C++
// headers of the same wheel (scripts/setup.sh), and offers plain C functions.
//
// An allocator is a process-wide object that lives as long as the process
// (ProcessState and GPUProcessState own them), so its pointer may be kept.
//
// Rust calls these functions: no C++ exception may unwind into it (undefined
// behaviour). Each is noexcept and catches everything, answering as when the
// device or statistics are not there (std::bad_alloc from the strings here,
// or whatever TensorFlow throws).

#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/c/c_api_internal.h"
#include "tensorflow/c/eager/immediate_execution_context.h"
#include "tensorflow/c/eager/tfe_context_internal.h"
#include "tensorflow/core/common_runtime/device.h"
#include "tensorflow/core/common_runtime/device_mgr.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/public/session.h"

namespace {

// "cpu:0" of "/job:localhost/replica:0/task:0/device:CPU:0", "/device:CPU:0",
// "/cpu:0" and "CPU:0" alike.
std::string TypeAndId(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  size_t at = name.rfind("device:");
  if (at != std::string::npos) return name.substr(at + 7);
  at = name.rfind('/');
  return at == std::string::npos ? name : name.substr(at + 1);
}

// `want` among `devices`: the same name, or the same type and id; an empty
// name is the default device an op without one runs on (the first GPU, else
// the first CPU).
tensorflow::Device* Find(const std::vector<tensorflow::Device*>& devices,
                         const char* want) {
  std::string wanted(want);
  if (wanted.empty()) {
    for (const char* type : {"GPU", "CPU"}) {
      for (tensorflow::Device* d : devices) {
        if (d->device_type() == type) return d;
      }
    }
    return nullptr;
  }
  for (tensorflow::Device* d : devices) {
    if (d->name() == wanted) return d;
  }
  std::string tail = TypeAndId(wanted);
  for (tensorflow::Device* d : devices) {
    if (TypeAndId(d->name()) == tail) return d;
  }
  return nullptr;
}

// `d`'s allocator (null without a device); `*on_host` says whether the
// device's memory is the host's (a CPU device).
void* AllocatorOf(tensorflow::Device* d, int* on_host) {
  if (d == nullptr) {
    return nullptr;
  }
  *on_host = d->device_type() == "CPU" ? 1 : 0;
  return d->GetAllocator(tensorflow::AllocatorAttributes());
}

}  // namespace

extern "C" {

// The allocator of `device` in an eager context, or null (see Find).
void* salus_eager_device_allocator(TFE_Context* ctx, const char* device,
                                   int* on_host) noexcept {
  try {
    return AllocatorOf(
        Find(tensorflow::unwrap(ctx)->ListLocalTfDevices(), device), on_host);
  } catch (...) {
    return nullptr;
  }
}

// The allocator of `device` in a session, or null (see Find).
void* salus_session_device_allocator(TF_Session* session, const char* device,
                                     int* on_host) noexcept {
  try {
    const tensorflow::DeviceMgr* mgr = nullptr;
    if (!session->session->LocalDeviceManager(&mgr).ok() || mgr == nullptr) {
      return nullptr;
    }
    return AllocatorOf(Find(mgr->ListDevices(), device), on_host);
  } catch (...) {
    return nullptr;
  }
}

// 1 and the figures when the allocator keeps statistics, else 0.
int salus_allocator_stats(void* allocator, int64_t* in_use,
                          int64_t* peak) noexcept {
  try {
    auto stats = static_cast<tensorflow::Allocator*>(allocator)->GetStats();
    if (!stats) {
      return 0;
    }
    *in_use = stats->bytes_in_use;
    *peak = stats->peak_bytes_in_use;
    return 1;
  } catch (...) {
    return 0;
  }
}

// Resets the peak to the bytes in use now; 1 when the allocator could.
int salus_allocator_clear_stats(void* allocator) noexcept {
  try {
    return static_cast<tensorflow::Allocator*>(allocator)->ClearStats() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

}  // extern "C"

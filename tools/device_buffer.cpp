// tools/device_buffer.cpp — see device_buffer.hpp.
#include "tools/device_buffer.hpp"

#include <stdexcept>
#include <utility>

#include "flashattn/error.hpp"

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace flashattn::tools {

#if defined(FLASHATTN_WITH_CUDA)

namespace {
void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + call + ": " + cudaGetErrorString(status));
}
}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  // cudaMalloc(0) may return null; keep one byte so views always have an address.
  check(cudaMalloc(&data_, bytes > 0 ? bytes : 1), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);  // a destructor cannot report; freeing valid memory does not fail
}
void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw std::logic_error("DeviceBuffer::upload: more bytes than allocated");
  check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
}
void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) throw std::logic_error("DeviceBuffer::download: more bytes than allocated");
  check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}
void DeviceBuffer::fill_bytes(unsigned char value) {
  check(cudaMemset(data_, value, bytes_), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

EventTimer::EventTimer() {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  const cudaError_t status = cudaEventCreate(&stop);
  if (status != cudaSuccess) cudaEventDestroy(start);
  check(status, "cudaEventCreate");
  start_ = start;
  stop_ = stop;
}
EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void EventTimer::start() { check(cudaEventRecord(static_cast<cudaEvent_t>(start_), nullptr), "cudaEventRecord"); }
double EventTimer::stop_ms() {
  check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), nullptr), "cudaEventRecord");
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
        "cudaEventElapsedTime");
  return ms;
}

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

std::string device_name(int ordinal) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
  return properties.name;
}

#else  // no CUDA in this build

namespace {
[[noreturn]] void no_cuda() { throw NotSupported("flashattn: device: this build has no CUDA backend"); }
}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*, std::size_t) { no_cuda(); }
void DeviceBuffer::download(void*, std::size_t) const { no_cuda(); }
void DeviceBuffer::fill_bytes(unsigned char) { no_cuda(); }
EventTimer::EventTimer() { no_cuda(); }
EventTimer::~EventTimer() = default;
void EventTimer::start() { no_cuda(); }
double EventTimer::stop_ms() { no_cuda(); }
void device_synchronize() { no_cuda(); }
std::string device_name(int) { no_cuda(); }

#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

}  // namespace flashattn::tools

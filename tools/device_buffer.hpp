// tools/device_buffer.hpp — the CLI's only contact with the CUDA runtime: device
// allocations, copies, poisoning and event timing. Every CUDA return code is
// checked and turned into a std::runtime_error naming the call. In a build without
// CUDA the functions throw flashattn::NotSupported (the CLI never calls them then:
// it picks the CPU when flashattn::cuda_available() is false).
#pragma once

#include <cstddef>
#include <string>

namespace flashattn::tools {

// An owning allocation on the current CUDA device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  // Set every byte to `value`; 0xFF makes every float16/bfloat16/float32 a NaN, so
  // anything a kernel forgets to write shows up in the check.
  void fill_bytes(unsigned char value);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Times work on the default stream with a pair of CUDA events.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  // Records the stop event, waits for it and returns the elapsed milliseconds.
  double stop_ms();

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

void device_synchronize();
std::string device_name(int ordinal);

}  // namespace flashattn::tools

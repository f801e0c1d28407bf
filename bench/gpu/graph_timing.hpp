// bench/gpu/graph_timing.hpp — how the GPU decode benchmarks time a step: the calls are
// captured in one CUDA graph (as serving engines replay decode steps, so host launch
// latency is not in the number), the graph is replayed warm-up + timed times between
// CUDA events, and each timed replay gives graph time / calls.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace flashattn::bench {

inline void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(code));
    std::exit(1);
  }
}

// Captures enqueue(i) for i in [0, calls) on `stream` (which must not be the legacy
// default stream) and returns the ms per call of each of `repeats` timed replays.
template <class Enqueue>
std::vector<float> time_graph_replays(cudaStream_t stream, int calls, int warmup, int repeats, Enqueue&& enqueue) {
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "capture");
  for (int i = 0; i < calls; ++i) enqueue(i);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int r = 0; r < warmup + repeats; ++r) {
    check(cudaEventRecord(start, stream), "record");
    check(cudaGraphLaunch(exec, stream), "graph launch");
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (r >= warmup) times.push_back(ms / static_cast<float>(calls));
  }
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  check(cudaGraphExecDestroy(exec), "graph exec");
  check(cudaGraphDestroy(graph), "graph");
  return times;
}

}  // namespace flashattn::bench

// Host cost of one kernel launch by each route the CUDA runtime and driver offer, and of the
// runtime calls a collective makes around it (event record, capture query), on one stream.
//
//   nvcc -O2 -std=c++17 -arch=sm_90a benchmarks/launch_probe.cu -lcuda -o /tmp/launch_probe && /tmp/launch_probe
//
// Run it under MPS and without to see what the daemon adds. Each row: the host's wall time per
// call over n back-to-back calls of a kernel that does (almost) nothing, after a warm-up, for two
// values of n below the launch queue's depth (a full queue would time the GPU, not the host).
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <functional>

__global__ void tiny(int* p, int a, int b) {
  if (p && a < 0 && threadIdx.x == 0) p[0] = a + b;  // never true: the kernel's cost is its launch
}

static double perCall(int n, const std::function<void()>& f, cudaStream_t s) {
  for (int i = 0; i < 200; ++i) f();
  cudaStreamSynchronize(s);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  auto t1 = std::chrono::steady_clock::now();
  cudaStreamSynchronize(s);
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

int main() {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int* d = nullptr;
  cudaMalloc(&d, 4);
  int a = 1, b = 2;
  void* args[] = {&d, &a, &b};
  cudaFunction_t rf;
  cudaGetFuncBySymbol(&rf, reinterpret_cast<const void*>(tiny));
  CUfunction cf = reinterpret_cast<CUfunction>(rf);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  CUresult driver = CUDA_SUCCESS;
  for (int n : {100, 500}) {
    for (int blocks : {8, 132}) {
      std::printf("n %d, grid %d x 512\n", n, blocks);
      std::printf("  <<<>>>              %6.2f us\n", perCall(n, [&] { tiny<<<blocks, 512, 0, s>>>(d, a, b); }, s));
      std::printf("  cudaLaunchKernel    %6.2f us\n", perCall(n, [&] {
        cudaLaunchKernel(reinterpret_cast<const void*>(tiny), dim3(blocks), dim3(512), args, 0, s);
      }, s));
      std::printf("  cuLaunchKernel      %6.2f us\n", perCall(n, [&] {
        CUresult r = cuLaunchKernel(cf, blocks, 1, 1, 512, 1, 1, 0, s, args, nullptr);
        if (r != CUDA_SUCCESS) driver = r;
      }, s));
    }
  }
  const int n = 500;
  std::printf("cudaEventRecord       %6.2f us\n", perCall(n, [&] { cudaEventRecord(ev, s); }, s));
  cudaStreamCaptureStatus st;
  std::printf("cudaStreamIsCapturing %6.2f us\n", perCall(n, [&] { cudaStreamIsCapturing(s, &st); }, s));
  int dev = 0;
  std::printf("cudaGetDevice         %6.2f us\n", perCall(n, [&] { cudaGetDevice(&dev); }, s));
  cudaError_t e = cudaGetLastError();
  std::printf("last runtime error: %s; cuLaunchKernel: %d\n", cudaGetErrorString(e), static_cast<int>(driver));
  return e == cudaSuccess && driver == CUDA_SUCCESS ? 0 : 1;
}

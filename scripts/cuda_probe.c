// scripts/cuda_probe.c: what the CUDA runtime sees (device count or its error, each device's name, compute capability and PCI bus), for scripts/gpu-check.sh to hold against nvidia-smi.
// Built by gpu-check.sh with the host compiler against the toolkit's libcudart (seconds, no nvcc, no CMake).
// Output, one fact per line: "cuda devices N" or "cuda error NAME: TEXT", then "cuda device I: NAME, sm_XY, bus B".
// Exit status: 0 when at least one device is usable, 1 when none (the reason printed), 2 on a bad argument.
#include <cuda_runtime_api.h>
#include <stdio.h>

int main(int argc, char **argv) {
  (void)argv;
  if (argc != 1) {
    fprintf(stderr, "usage: cuda_probe (no arguments)\n");
    return 2;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    printf("cuda error %s: %s\n", cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
  }
  printf("cuda devices %d\n", n);
  int usable = 0;
  for (int i = 0; i < n; i++) {
    struct cudaDeviceProp p;
    char bus[32] = "?";
    e = cudaGetDeviceProperties(&p, i);
    if (e == cudaSuccess) cudaDeviceGetPCIBusId(bus, sizeof bus, i);
    // A device is usable when a context can be made on it (cudaFree(0) makes one): a device the driver lists
    // but cannot open (wrong mode, ECC error, MIG without an instance) fails here rather than in the first test.
    if (e == cudaSuccess && (e = cudaSetDevice(i)) == cudaSuccess) e = cudaFree(0);
    if (e != cudaSuccess) {
      printf("cuda device %d: unusable (%s: %s)\n", i, cudaGetErrorName(e), cudaGetErrorString(e));
      continue;
    }
    printf("cuda device %d: %s, sm_%d%d, bus %s\n", i, p.name, p.major, p.minor, bus);
    usable++;
  }
  if (!usable) printf("cuda error: no usable device\n");
  return usable ? 0 : 1;
}

"""The few CUDA runtime calls the arena makes itself, through the libcudart onnxruntime-gpu loads.

ONNX Runtime moves nothing between slots: a refilled slot's rows, an encoder's keys and values
and each run's input ids are copied by us, as strided or plain copies queued on the stream the
session computes on (ort_session.create_session gives it one of ours), so that they are ordered
with its kernels without a synchronization. Loaded only on a CUDA host; ctypes, no extra package.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import onnxruntime as ort

HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 1, 2, 3  # cudaMemcpyKind


def preload_cuda_libraries() -> None:
    """Make the CUDA libraries of pip's nvidia-* packages loadable (onnxruntime-gpu's own loader);
    a host whose CUDA is on the library path needs nothing."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        with contextlib.suppress(Exception):  # best effort: the session's own loading says what is missing
            preload(cuda=True, cudnn=True, msvc=False)


class CudaRuntime:
    """cudaMemcpy2DAsync, cudaMemcpyAsync, cudaMemset, cudaMemGetInfo and streams, by ctypes."""

    def __init__(self) -> None:
        self.lib = self.load()
        void, size = ctypes.c_void_p, ctypes.c_size_t
        self.lib.cudaMemcpy2DAsync.argtypes = [void, size, void, size, size, size, ctypes.c_int, void]
        self.lib.cudaMemcpyAsync.argtypes = [void, void, size, ctypes.c_int, void]
        self.lib.cudaMemcpy.argtypes = [void, void, size, ctypes.c_int]
        self.lib.cudaMemset.argtypes = [void, ctypes.c_int, size]
        self.lib.cudaStreamCreate.argtypes = [ctypes.POINTER(void)]
        self.lib.cudaStreamSynchronize.argtypes = [void]
        self.lib.cudaMemGetInfo.argtypes = [ctypes.POINTER(size), ctypes.POINTER(size)]

    @staticmethod
    def load() -> ctypes.CDLL:
        """The libcudart onnxruntime-gpu uses (its name differs by CUDA version and OS)."""
        names = ("libcudart.so.13", "libcudart.so.12", "libcudart.so", "cudart64_12.dll")
        for attempt in range(2):
            for name in names:
                try:
                    return ctypes.CDLL(name)
                except OSError:
                    continue
            if attempt == 0:
                preload_cuda_libraries()
        site = os.path.dirname(ort.__path__[0])  # pip's nvidia-* packages sit beside onnxruntime
        for path in sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so.*"))):
            return ctypes.CDLL(path)
        raise RuntimeError(
            "the CUDA runtime (libcudart) cannot be loaded; it comes with onnxruntime-gpu's CUDA dependencies"
        )

    def create_stream(self) -> int:
        stream = ctypes.c_void_p()
        self.check("cudaStreamCreate", self.lib.cudaStreamCreate(ctypes.byref(stream)))
        return int(stream.value or 0)

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int, stream: int) -> None:
        """`rows` runs of `width` bytes, `*_pitch` bytes apart, device to device: one call, queued on `stream`."""
        self.check(
            "cudaMemcpy2DAsync",
            self.lib.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, DEVICE_TO_DEVICE, stream),
        )

    def upload(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Host to device, queued on `stream`. From pageable memory the call returns once the bytes
        are staged, so the host buffer may be reused at once."""
        self.check("cudaMemcpyAsync", self.lib.cudaMemcpyAsync(dst, src, nbytes, HOST_TO_DEVICE, stream))

    def download(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Device to host after everything queued on `stream` (the parity gate's and tests' reads)."""
        self.check("cudaStreamSynchronize", self.lib.cudaStreamSynchronize(stream))
        self.check("cudaMemcpy", self.lib.cudaMemcpy(dst, src, nbytes, DEVICE_TO_HOST))

    def zero(self, address: int, nbytes: int) -> None:
        self.check("cudaMemset", self.lib.cudaMemset(address, 0, nbytes))

    def free_memory(self) -> int:
        """Bytes free on the current device."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cudaMemGetInfo", self.lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)))
        return int(free.value)

    @staticmethod
    def check(call: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")


_cuda: CudaRuntime | None = None


def cuda_runtime() -> CudaRuntime:
    global _cuda
    if _cuda is None:
        _cuda = CudaRuntime()
    return _cuda

"""Names of CUDA error codes: the runtime's cudaError_t and the driver's CUresult.

nsys stores a call's return value as a bare integer (`returnValue`). The two enums share most
numbers (2 is out of memory in both, 800 "not permitted") but not all their names, so the API
name decides which table applies. From the CUDA 13.0 headers (`driver_types.h`, `cuda.h`);
numbers not listed are named "error N".
"""

from __future__ import annotations

_RUNTIME = """
1 InvalidValue; 2 MemoryAllocation; 3 InitializationError; 4 CudartUnloading; 5 ProfilerDisabled;
6 ProfilerNotInitialized; 7 ProfilerAlreadyStarted; 8 ProfilerAlreadyStopped; 9 InvalidConfiguration;
12 InvalidPitchValue; 13 InvalidSymbol; 16 InvalidHostPointer; 17 InvalidDevicePointer; 18 InvalidTexture;
19 InvalidTextureBinding; 20 InvalidChannelDescriptor; 21 InvalidMemcpyDirection; 22 AddressOfConstant;
23 TextureFetchFailed; 24 TextureNotBound; 25 SynchronizationError; 26 InvalidFilterSetting;
27 InvalidNormSetting; 28 MixedDeviceExecution; 31 NotYetImplemented; 32 MemoryValueTooLarge;
34 StubLibrary; 35 InsufficientDriver; 36 CallRequiresNewerDriver; 37 InvalidSurface;
43 DuplicateVariableName; 44 DuplicateTextureName; 45 DuplicateSurfaceName; 46 DevicesUnavailable;
49 IncompatibleDriverContext; 52 MissingConfiguration; 53 PriorLaunchFailure; 65 LaunchMaxDepthExceeded;
66 LaunchFileScopedTex; 67 LaunchFileScopedSurf; 68 SyncDepthExceeded; 69 LaunchPendingCountExceeded;
98 InvalidDeviceFunction; 100 NoDevice; 101 InvalidDevice; 102 DeviceNotLicensed;
103 SoftwareValidityNotEstablished; 127 StartupFailure; 200 InvalidKernelImage; 201 DeviceUninitialized;
205 MapBufferObjectFailed; 206 UnmapBufferObjectFailed; 207 ArrayIsMapped; 208 AlreadyMapped;
209 NoKernelImageForDevice; 210 AlreadyAcquired; 211 NotMapped; 212 NotMappedAsArray; 213 NotMappedAsPointer;
214 ECCUncorrectable; 215 UnsupportedLimit; 216 DeviceAlreadyInUse; 217 PeerAccessUnsupported; 218 InvalidPtx;
219 InvalidGraphicsContext; 220 NvlinkUncorrectable; 221 JitCompilerNotFound; 222 UnsupportedPtxVersion;
223 JitCompilationDisabled; 224 UnsupportedExecAffinity; 225 UnsupportedDevSideSync; 300 InvalidSource;
301 FileNotFound; 302 SharedObjectSymbolNotFound; 303 SharedObjectInitFailed; 304 OperatingSystem;
400 InvalidResourceHandle; 401 IllegalState; 402 LossyQuery; 500 SymbolNotFound; 600 NotReady;
700 IllegalAddress; 701 LaunchOutOfResources; 702 LaunchTimeout; 703 LaunchIncompatibleTexturing;
704 PeerAccessAlreadyEnabled; 705 PeerAccessNotEnabled; 708 SetOnActiveProcess; 709 ContextIsDestroyed;
710 Assert; 711 TooManyPeers; 712 HostMemoryAlreadyRegistered; 713 HostMemoryNotRegistered;
714 HardwareStackError; 715 IllegalInstruction; 716 MisalignedAddress; 717 InvalidAddressSpace; 718 InvalidPc;
719 LaunchFailure; 720 CooperativeLaunchTooLarge; 800 NotPermitted; 801 NotSupported; 802 SystemNotReady;
803 SystemDriverMismatch; 804 CompatNotSupportedOnDevice; 805 MpsConnectionFailed; 806 MpsRpcFailure;
807 MpsServerNotReady; 808 MpsMaxClientsReached; 809 MpsMaxConnectionsReached; 810 MpsClientTerminated;
811 CdpNotSupported; 812 CdpVersionMismatch; 900 StreamCaptureUnsupported; 901 StreamCaptureInvalidated;
902 StreamCaptureMerge; 903 StreamCaptureUnmatched; 904 StreamCaptureUnjoined; 905 StreamCaptureIsolation;
906 StreamCaptureImplicit; 907 CapturedEvent; 908 StreamCaptureWrongThread; 909 Timeout;
910 GraphExecUpdateFailure; 911 ExternalDevice; 912 InvalidClusterSize; 913 FunctionNotLoaded;
914 InvalidResourceType; 915 InvalidResourceConfiguration; 999 Unknown; 10000 ApiFailureBase
"""

_DRIVER = """
1 INVALID_VALUE; 2 OUT_OF_MEMORY; 3 NOT_INITIALIZED; 4 DEINITIALIZED; 5 PROFILER_DISABLED;
6 PROFILER_NOT_INITIALIZED; 7 PROFILER_ALREADY_STARTED; 8 PROFILER_ALREADY_STOPPED; 34 STUB_LIBRARY;
46 DEVICE_UNAVAILABLE; 100 NO_DEVICE; 101 INVALID_DEVICE; 102 DEVICE_NOT_LICENSED; 200 INVALID_IMAGE;
201 INVALID_CONTEXT; 202 CONTEXT_ALREADY_CURRENT; 205 MAP_FAILED; 206 UNMAP_FAILED; 207 ARRAY_IS_MAPPED;
208 ALREADY_MAPPED; 209 NO_BINARY_FOR_GPU; 210 ALREADY_ACQUIRED; 211 NOT_MAPPED; 212 NOT_MAPPED_AS_ARRAY;
213 NOT_MAPPED_AS_POINTER; 214 ECC_UNCORRECTABLE; 215 UNSUPPORTED_LIMIT; 216 CONTEXT_ALREADY_IN_USE;
217 PEER_ACCESS_UNSUPPORTED; 218 INVALID_PTX; 219 INVALID_GRAPHICS_CONTEXT; 220 NVLINK_UNCORRECTABLE;
221 JIT_COMPILER_NOT_FOUND; 222 UNSUPPORTED_PTX_VERSION; 223 JIT_COMPILATION_DISABLED;
224 UNSUPPORTED_EXEC_AFFINITY; 225 UNSUPPORTED_DEVSIDE_SYNC; 300 INVALID_SOURCE; 301 FILE_NOT_FOUND;
302 SHARED_OBJECT_SYMBOL_NOT_FOUND; 303 SHARED_OBJECT_INIT_FAILED; 304 OPERATING_SYSTEM; 400 INVALID_HANDLE;
401 ILLEGAL_STATE; 402 LOSSY_QUERY; 500 NOT_FOUND; 600 NOT_READY; 700 ILLEGAL_ADDRESS;
701 LAUNCH_OUT_OF_RESOURCES; 702 LAUNCH_TIMEOUT; 703 LAUNCH_INCOMPATIBLE_TEXTURING;
704 PEER_ACCESS_ALREADY_ENABLED; 705 PEER_ACCESS_NOT_ENABLED; 708 PRIMARY_CONTEXT_ACTIVE;
709 CONTEXT_IS_DESTROYED; 710 ASSERT; 711 TOO_MANY_PEERS; 712 HOST_MEMORY_ALREADY_REGISTERED;
713 HOST_MEMORY_NOT_REGISTERED; 714 HARDWARE_STACK_ERROR; 715 ILLEGAL_INSTRUCTION; 716 MISALIGNED_ADDRESS;
717 INVALID_ADDRESS_SPACE; 718 INVALID_PC; 719 LAUNCH_FAILED; 720 COOPERATIVE_LAUNCH_TOO_LARGE;
800 NOT_PERMITTED; 801 NOT_SUPPORTED; 802 SYSTEM_NOT_READY; 803 SYSTEM_DRIVER_MISMATCH;
804 COMPAT_NOT_SUPPORTED_ON_DEVICE; 805 MPS_CONNECTION_FAILED; 806 MPS_RPC_FAILURE; 807 MPS_SERVER_NOT_READY;
808 MPS_MAX_CLIENTS_REACHED; 809 MPS_MAX_CONNECTIONS_REACHED; 810 MPS_CLIENT_TERMINATED;
811 CDP_NOT_SUPPORTED; 812 CDP_VERSION_MISMATCH; 900 STREAM_CAPTURE_UNSUPPORTED;
901 STREAM_CAPTURE_INVALIDATED; 902 STREAM_CAPTURE_MERGE; 903 STREAM_CAPTURE_UNMATCHED;
904 STREAM_CAPTURE_UNJOINED; 905 STREAM_CAPTURE_ISOLATION; 906 STREAM_CAPTURE_IMPLICIT; 907 CAPTURED_EVENT;
908 STREAM_CAPTURE_WRONG_THREAD; 909 TIMEOUT; 910 GRAPH_EXEC_UPDATE_FAILURE; 911 EXTERNAL_DEVICE;
912 INVALID_CLUSTER_SIZE; 913 FUNCTION_NOT_LOADED; 914 INVALID_RESOURCE_TYPE;
915 INVALID_RESOURCE_CONFIGURATION; 999 UNKNOWN
"""


def _table(text: str, prefix: str) -> dict[int, str]:
    pairs = (item.split() for item in text.replace("\n", " ").split(";") if item.strip())
    return {int(code): prefix + name for code, name in pairs}


RUNTIME_ERRORS = _table(_RUNTIME, "cudaError")
DRIVER_ERRORS = _table(_DRIVER, "CUDA_ERROR_")
OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY


def error_name(api: str, code: int) -> str:
    """`cudaErrorMemoryAllocation` for (cudaMalloc, 2), `CUDA_ERROR_NOT_PERMITTED` for (cuMemCreate, 800);
    runtime names for `cuda*` APIs, driver names for `cu*` ones."""
    if code == 0:
        return "cudaSuccess" if api.startswith("cuda") else "CUDA_SUCCESS"
    table = RUNTIME_ERRORS if api.startswith("cuda") else DRIVER_ERRORS
    return table.get(code, f"error {code}")

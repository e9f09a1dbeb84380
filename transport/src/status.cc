#include "tandem/transport/status.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tandem {

const char* status_name(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kTimeout: return "timeout";
    case Status::kAborted: return "aborted";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kUnreachablePeer: return "unreachable peer";
    case Status::kCudaError: return "CUDA error";
    case Status::kSystemError: return "system error";
    case Status::kBootstrapError: return "bootstrap error";
    case Status::kOutOfMemory: return "out of memory";
    case Status::kUnsupported: return "unsupported";
    case Status::kInternal: return "internal error";
    case Status::kPeerExited: return "peer exited";
  }
  return "unknown status";
}

const char* device_op_name(DeviceOp op) {
  switch (op) {
    case DeviceOp::kNone: return "none";
    case DeviceOp::kWaitUntil: return "wait_until";
    case DeviceOp::kBarrier: return "barrier";
    case DeviceOp::kPut: return "put";
    case DeviceOp::kSignal: return "signal";
    case DeviceOp::kQuiet: return "quiet";
    case DeviceOp::kProxy: return "proxy";
  }
  return "unknown op";
}

// Plain string building (no iostreams): error paths should depend on as little of the C++ runtime as they can.
std::string format_error_message(Status status, const std::string& op, int rank, int peer,
                                 const std::string& detail) {
  std::string s = "tandem: rank " + std::to_string(rank) + ": " + op;
  if (peer >= 0) s += " (peer " + std::to_string(peer) + ")";
  s += ": ";
  s += status_name(status);
  if (!detail.empty()) s += ": " + detail;
  return s;
}

Error::Error(Status status, std::string op, int rank, int peer, const std::string& detail)
    : std::runtime_error(format_error_message(status, op, rank, peer, detail)),
      status_(status),
      op_(std::move(op)),
      rank_(rank),
      peer_(peer) {}

void throw_cuda_error(int cuda_error, const char* expr, const char* op, int rank, int peer) {
  const auto e = static_cast<cudaError_t>(cuda_error);
  const std::string detail = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") in " + expr;
  throw Error(e == cudaErrorMemoryAllocation ? Status::kOutOfMemory : Status::kCudaError, op, rank, peer, detail);
}

void throw_cu_error(int cu_result, const char* expr, const char* op, int rank, int peer) {
  const std::string detail = "CUresult " + std::to_string(cu_result) + " in " + expr;
  const Status s = cu_result == CUDA_ERROR_OUT_OF_MEMORY ? Status::kOutOfMemory
                   : cu_result == CUDA_ERROR_NOT_SUPPORTED ? Status::kUnsupported
                                                           : Status::kCudaError;
  throw Error(s, op, rank, peer, detail);
}

}  // namespace tandem

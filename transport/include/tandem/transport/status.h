// tandem transport — status codes and the exception type of the host API.
#pragma once

#include <stdexcept>
#include <string>

#include "tandem/transport/device_comm.h"

namespace tandem {

const char* status_name(Status status);
// "tandem: rank R: OP (peer P): STATUS: DETAIL" — the text of Error::what().
std::string format_error_message(Status status, const std::string& op, int rank, int peer, const std::string& detail);

// An error as plain data (what Error carries), for callers that must not unwind (bindings, C APIs).
struct ErrorInfo {
  Status status;
  std::string op;
  int rank;
  int peer;
  std::string detail;
  std::string message;  // formatted like Error::what()
};
const char* device_op_name(DeviceOp op);

// Every host-side failure of tandem is reported as tandem::Error. `rank` is the rank that observed it, `peer`
// the rank it was waiting for or talking to (-1 if none), `op` the operation (e.g. "barrier", "heap.import").
class Error : public std::runtime_error {
 public:
  Error(Status status, std::string op, int rank, int peer, const std::string& detail);
  Status status() const { return status_; }
  const std::string& op() const { return op_; }
  int rank() const { return rank_; }
  int peer() const { return peer_; }

 private:
  Status status_;
  std::string op_;
  int rank_;
  int peer_;
};

[[noreturn]] void throw_cuda_error(int cuda_error, const char* expr, const char* op, int rank, int peer = -1);
[[noreturn]] void throw_cu_error(int cu_result, const char* expr, const char* op, int rank, int peer = -1);

}  // namespace tandem

// Check a CUDA runtime call; on failure throw tandem::Error naming the op and rank in scope.
#define TANDEM_CUDA_CHECK(expr, op, rank)                                          \
  do {                                                                             \
    const auto tandem_err_ = (expr);                                               \
    if (tandem_err_ != 0) ::tandem::throw_cuda_error(static_cast<int>(tandem_err_), #expr, op, rank); \
  } while (0)

#define TANDEM_CU_CHECK(expr, op, rank)                                            \
  do {                                                                             \
    const auto tandem_err_ = (expr);                                               \
    if (tandem_err_ != 0) ::tandem::throw_cu_error(static_cast<int>(tandem_err_), #expr, op, rank); \
  } while (0)

// Exchange of file descriptors between the processes of one host over abstract unix sockets (SCM_RIGHTS).
// cuMem handles exported as POSIX fds are only meaningful in the process that owns them; this is how a peer
// gets its own reference to the same physical memory (and keeps it alive if the exporter dies).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace tandem::detail {

// Collective over `local_ranks` (which contains this rank): every rank offers `my_fd` and gets, for each
// peer, a new descriptor it owns. Construct (listen) first, run after a bootstrap barrier, so that every
// listener exists before anyone connects. `session` must be identical on all ranks and unique per exchange.
class FdExchange {
 public:
  FdExchange(const std::string& session, int rank, std::chrono::milliseconds timeout);
  ~FdExchange();
  std::map<int, int> run(const std::vector<int>& local_ranks, int my_fd);

 private:
  std::string session_;
  int rank_;
  std::chrono::milliseconds timeout_;
  int listen_fd_ = -1;
};

}  // namespace tandem::detail

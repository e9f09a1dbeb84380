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
//
// The descriptor grants read/write access to this rank's GPU heap, so it goes only to a process that has the
// same uid (SO_PEERCRED), is the process the claimed rank published (`identities`, local_identity(), where
// pids are comparable) and sends the job secret with its rank first (see unix_socket.h). Anything else is
// refused, does not use up a peer's turn, and the exchange goes on until every peer was served once.
class FdExchange {
 public:
  FdExchange(const std::string& session, int rank, std::chrono::milliseconds timeout);
  ~FdExchange();
  FdExchange(const FdExchange&) = delete;
  FdExchange& operator=(const FdExchange&) = delete;
  // `identities[r]`: what rank r published as local_identity() (missing or empty: uid check only).
  std::map<int, int> run(const std::vector<int>& local_ranks, int my_fd, const std::string& secret,
                         const std::map<int, std::string>& identities);
  // Connections refused so far (wrong uid/pid, no or bad hello, unknown or already served rank).
  int refused() const { return refused_; }

 private:
  std::string serve_one(int s, const std::vector<int>& local_ranks, const std::vector<int>& served,
                        const std::string& secret, const std::map<int, std::string>& identities,
                        std::chrono::steady_clock::time_point deadline, int* peer);
  std::string session_;
  int rank_;
  std::chrono::milliseconds timeout_;
  int listen_fd_ = -1;
  int refused_ = 0;
};

}  // namespace tandem::detail

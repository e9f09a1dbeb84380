// tandem transport — bootstrap: the out-of-band key/value exchange used to set a communicator up.
//
// tandem does not ship a rendezvous service of its own. Python users pass torch.distributed's store (TCPStore,
// FileStore, the default group's store); C++ users implement Bootstrap over whatever their launcher offers
// (MPI, a KV service) or use FileBootstrap over a directory all ranks can see.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace tandem {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Publish `value` under `key` (keys are written once).
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Block until `key` exists and return its value; throw tandem::Error (kBootstrapError) on timeout.
  virtual std::string get(const std::string& key) = 0;

  // Collective helpers built on set/get. `tag` must be unique per call and identical on all ranks.
  std::vector<std::string> all_gather(const std::string& tag, const std::string& mine);
  void barrier(const std::string& tag);
};

// Per-job secret (kJobSecretBytes random bytes): rank 0 draws it from the kernel (getrandom, else
// /dev/urandom) and publishes it under `tag + "/secret"`; every rank returns it. Collective over all ranks.
// It is what lets a listener tell this job's ranks from any other process that can reach its sockets (the
// fd exchange, the peer monitor, the TCP proxy); whoever can read the store is a member. Never log it.
constexpr size_t kJobSecretBytes = 32;
std::string job_secret(Bootstrap& bootstrap, const std::string& tag);
// Equality of two secrets in time independent of where they differ (no early exit an attacker could time).
bool secret_equal(const void* a, const void* b, size_t n);

// Bootstrap over a shared directory: each key is a file written atomically (write + rename).
class FileBootstrap final : public Bootstrap {
 public:
  FileBootstrap(std::string directory, int rank, int world,
                std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // Reads TANDEM_BOOTSTRAP_DIR, RANK and WORLD_SIZE (as set by `python -m tandem.launch`).
  static FileBootstrap from_env();
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;

 private:
  std::string path_for(const std::string& key) const;
  std::string dir_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tandem

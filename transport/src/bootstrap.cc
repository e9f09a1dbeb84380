#include "tandem/transport/bootstrap.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <thread>

#include "tandem/transport/status.h"

namespace tandem {

std::vector<std::string> Bootstrap::all_gather(const std::string& tag, const std::string& mine) {
  set(tag + "/" + std::to_string(rank()), mine);
  std::vector<std::string> out(world());
  for (int r = 0; r < world(); ++r) out[r] = r == rank() ? mine : get(tag + "/" + std::to_string(r));
  return out;
}

void Bootstrap::barrier(const std::string& tag) { all_gather(tag, ""); }

std::string job_secret(Bootstrap& bootstrap, const std::string& tag) {
  const std::string key = tag + "/secret";
  if (bootstrap.rank() != 0) {
    std::string s = bootstrap.get(key);
    if (s.size() != kJobSecretBytes)
      throw Error(Status::kBootstrapError, "bootstrap.secret", bootstrap.rank(), 0,
                  "job secret has " + std::to_string(s.size()) + " bytes, expected " + std::to_string(kJobSecretBytes));
    return s;
  }
  std::string s(kJobSecretBytes, '\0');
  size_t got = 0;
  while (got < s.size()) {  // getrandom blocks only until the pool is initialised, once per boot
    const ssize_t k = ::getrandom(s.data() + got, s.size() - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  if (got < s.size()) {  // no getrandom (old kernel, seccomp): the device the syscall stands for
    FILE* f = std::fopen("/dev/urandom", "rb");
    got = f != nullptr ? std::fread(s.data(), 1, s.size(), f) : 0;
    if (f != nullptr) std::fclose(f);
  }
  if (got < s.size())  // a guessable secret is worse than none: refuse to start
    throw Error(Status::kSystemError, "bootstrap.secret", 0, -1, "cannot read random bytes (getrandom, /dev/urandom)");
  bootstrap.set(key, s);
  return s;
}

bool secret_equal(const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const volatile unsigned char*>(a);
  const auto* y = static_cast<const volatile unsigned char*>(b);
  unsigned char diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(x[i] ^ y[i]);
  return diff == 0;
}

FileBootstrap::FileBootstrap(std::string directory, int rank, int world, std::chrono::milliseconds timeout)
    : dir_(std::move(directory)), rank_(rank), world_(world), timeout_(timeout) {
  if (world <= 0 || rank < 0 || rank >= world)
    throw Error(Status::kInvalidArgument, "bootstrap", rank, -1,
                "rank " + std::to_string(rank) + " not in world of " + std::to_string(world));
  ::mkdir(dir_.c_str(), 0700);
}

FileBootstrap FileBootstrap::from_env() {
  const char* dir = std::getenv("TANDEM_BOOTSTRAP_DIR");
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (dir == nullptr || rank == nullptr || world == nullptr)
    throw Error(Status::kBootstrapError, "bootstrap", -1, -1,
                "TANDEM_BOOTSTRAP_DIR, RANK and WORLD_SIZE must be set (python -m tandem.launch sets them)");
  return FileBootstrap(dir, std::atoi(rank), std::atoi(world));
}

std::string FileBootstrap::path_for(const std::string& key) const {
  std::string name;
  for (char c : key) name += (c == '/' ? '.' : c);
  return dir_ + "/" + name;
}

void FileBootstrap::set(const std::string& key, const std::string& value) {
  const std::string path = path_for(key);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    // Owner-only: values include the job secret, and the directory may be shared (mkdir keeps an existing
    // directory's mode).
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t done = 0;
    while (fd >= 0 && done < value.size()) {
      const ssize_t k = ::write(fd, value.data() + done, value.size() - done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      done += static_cast<size_t>(k);
    }
    if (fd >= 0) ::close(fd);
    if (fd < 0 || done != value.size())
      throw Error(Status::kBootstrapError, "bootstrap.set", rank_, -1, "cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error(Status::kBootstrapError, "bootstrap.set", rank_, -1, "cannot rename to " + path);
}

std::string FileBootstrap::get(const std::string& key) {
  const std::string path = path_for(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      std::string value;
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) value.append(buf, n);
      std::fclose(f);
      return value;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(Status::kBootstrapError, "bootstrap.get", rank_, -1, "timed out waiting for key " + key);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace tandem

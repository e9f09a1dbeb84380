#include "tandem/transport/bootstrap.h"

#include <sys/stat.h>
#include <unistd.h>

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
    std::ofstream f(tmp, std::ios::binary);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!f) throw Error(Status::kBootstrapError, "bootstrap.set", rank_, -1, "cannot write " + tmp);
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

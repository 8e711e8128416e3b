#include "distributed/env.h"

#include <cstdlib>

#include "anvil/core/error.h"

namespace anvil::distributed {
namespace {

int64_t parse_int(const std::string& var, const std::string& value) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < 0)
    throw ConfigError(concat("environment variable ", var, "=\"", value, "\": expected a non-negative integer"));
  return v;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == ',' && depth == 0) break;
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    first += c;
  }
  const auto lb = first.find('[');
  if (lb == std::string::npos) return first;
  // prefix[03-07,12]suffix -> prefix03suffix
  const auto rb = first.find(']', lb);
  const auto inside = first.substr(lb + 1, (rb == std::string::npos ? first.size() : rb) - lb - 1);
  const auto start = inside.substr(0, inside.find_first_of(",-"));
  return first.substr(0, lb) + start + (rb == std::string::npos ? "" : first.substr(rb + 1));
}

ProcessInfo discover(const EnvLookup& env) {
  ProcessInfo p;
  // (rank, world, local rank, local world) variable names per launcher, in precedence order.
  struct Launcher {
    const char* name;
    const char *rank, *world, *local_rank, *local_world;
  };
  static const Launcher launchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const auto& l : launchers) {
    const auto rank = env(l.rank), world = env(l.world);
    if (!rank && !world) continue;
    if (!rank || !world)
      throw ConfigError(concat("environment: ", rank ? l.rank : l.world, " is set but ", rank ? l.world : l.rank,
                               " is not; ", l.name, " sets both"));
    p.launcher = l.name;
    p.rank = parse_int(l.rank, *rank);
    p.world_size = parse_int(l.world, *world);
    if (p.world_size < 1) throw ConfigError(concat("environment variable ", l.world, "=0: expected at least 1"));
    if (p.rank >= p.world_size)
      throw ConfigError(concat("environment: ", l.rank, "=", p.rank, " is not below ", l.world, "=", p.world_size));
    if (const auto lr = env(l.local_rank))
      p.local_rank = parse_int(l.local_rank, *lr);
    else
      p.local_rank = p.rank;  // one node
    // SLURM_NTASKS_PER_NODE may be a list like "4(x2)"; its leading count is this layout's.
    if (auto lw = env(l.local_world)) {
      auto v = *lw;
      if (std::string(l.name) == "slurm") v = v.substr(0, v.find_first_not_of("0123456789"));
      p.local_world_size = parse_int(l.local_world, v);
    } else {
      p.local_world_size = p.world_size;
    }
    if (p.local_rank >= p.local_world_size)
      throw ConfigError(concat("environment: ", l.local_rank, "=", p.local_rank, " is not below the ",
                               p.local_world_size, " processes per node"));
    if (p.launcher == "slurm")
      if (const auto nodes = env("SLURM_JOB_NODELIST"); nodes && !nodes->empty())
        p.master_addr = first_slurm_host(*nodes);
    break;
  }
  if (const auto a = env("MASTER_ADDR"); a && !a->empty()) p.master_addr = *a;
  if (const auto port = env("MASTER_PORT")) {
    p.master_port = parse_int("MASTER_PORT", *port);
    if (p.master_port < 1 || p.master_port > 65535)
      throw ConfigError(concat("environment variable MASTER_PORT=", *port, ": expected a port in 1..65535"));
  }
  if (p.launcher == "torchrun" && p.world_size > 1 && !env("MASTER_ADDR"))
    throw ConfigError("environment: WORLD_SIZE > 1 but MASTER_ADDR is not set; torchrun sets it");
  return p;
}

ProcessInfo discover_from_environment() {
  return discover([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace anvil::distributed

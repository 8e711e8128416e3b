#include "core/hub_cache.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <system_error>

#include "anvil/core/error.h"

namespace anvil::hub {
namespace {

namespace stdfs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool valid_part(const std::string& s) {
  if (s.empty() || s.size() > 96 || s.front() == '.' || s.front() == '-') return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return s.find("--") == std::string::npos && s.find("..") == std::string::npos;
}

struct RepoId {
  std::string owner, name, revision;
};

std::optional<RepoId> parse(const std::string& id) {
  auto text = id;
  std::string revision = "main";
  if (const auto at = text.find('@'); at != std::string::npos) {
    revision = text.substr(at + 1);
    text = text.substr(0, at);
    if (revision.empty() || revision.find("..") != std::string::npos || revision.front() == '/') return std::nullopt;
  }
  const auto slash = text.find('/');
  if (slash == std::string::npos || slash != text.rfind('/')) return std::nullopt;
  RepoId r{text.substr(0, slash), text.substr(slash + 1), revision};
  if (!valid_part(r.owner) || !valid_part(r.name)) return std::nullopt;
  return r;
}

stdfs::path repo_folder(const RepoId& r) { return cache_dir() / ("models--" + r.owner + "--" + r.name); }

std::string read_ref(const stdfs::path& file) {
  std::ifstream in(file);
  std::string hash;
  std::getline(in, hash);
  while (!hash.empty() && std::isspace(static_cast<unsigned char>(hash.back()))) hash.pop_back();
  return hash;
}

}  // namespace

stdfs::path cache_dir() {
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HF_HOME"); !v.empty()) return stdfs::path(v) / "hub";
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) return stdfs::path(v) / "huggingface" / "hub";
  return stdfs::path(env("HOME").empty() ? "/root" : env("HOME")) / ".cache" / "huggingface" / "hub";
}

bool is_repo_id(const std::string& name) { return parse(name).has_value(); }

std::optional<stdfs::path> resolve(const std::string& path_or_id) {
  std::error_code ec;
  if (path_or_id.empty()) return std::nullopt;
  if (stdfs::exists(path_or_id, ec)) return stdfs::path(path_or_id);
  const auto r = parse(path_or_id);
  if (!r) return std::nullopt;
  const auto repo = repo_folder(*r);
  const auto ref = repo / "refs" / r->revision;
  if (stdfs::is_regular_file(ref, ec)) {
    const auto snapshot = repo / "snapshots" / read_ref(ref);
    if (stdfs::is_directory(snapshot, ec)) return snapshot;
    return std::nullopt;
  }
  if (const auto snapshot = repo / "snapshots" / r->revision; stdfs::is_directory(snapshot, ec)) return snapshot;
  return std::nullopt;
}

stdfs::path local_path(const std::string& path_or_id) {
  auto r = resolve(path_or_id);
  return r ? *r : stdfs::path(path_or_id);
}

std::string explain_missing(const std::string& id) {
  const auto r = parse(id);
  if (!r) return "";
  const auto repo = repo_folder(*r);
  std::error_code ec;
  std::string what;
  if (!stdfs::is_directory(repo, ec)) {
    what = concat("no ", repo.string(),
                  " (the Hugging Face cache: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else "
                  "HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub)");
  } else {
    std::string known;
    for (const auto& sub : {"refs", "snapshots"})
      for (const auto& e : stdfs::directory_iterator(repo / sub, ec))
        known += (known.empty() ? "" : ", ") + e.path().filename().string();
    what = concat(repo.string(), " has no snapshot for revision \"", r->revision, "\"",
                  known.empty() ? std::string() : concat(" (it has: ", known, ")"));
  }
  const auto base = r->owner + "/" + r->name;
  return concat(what, "; Anvil downloads nothing at run time: fetch it once with `huggingface-cli download ", base,
                r->revision == "main" ? std::string() : " --revision " + r->revision, "`");
}

}  // namespace anvil::hub

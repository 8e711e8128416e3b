#pragma once
// Hugging Face Hub names read from the local cache: `model.from:
// Qwen/Qwen2.5-0.5B-Instruct` (optionally `@revision`) names the snapshot a
// `huggingface-cli download` left in the cache, laid out as huggingface_hub
// lays it out (models--<owner>--<name>/refs/<revision> holds a commit hash,
// snapshots/<hash>/ the files). Nothing is downloaded: a name not in the cache
// is an error that says where Anvil looked and how to fetch it.

#include <filesystem>
#include <optional>
#include <string>

namespace anvil::hub {

/// huggingface_hub's cache folder: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE,
/// else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
/// ~/.cache/huggingface/hub.
std::filesystem::path cache_dir();

/// Whether `name` has the form of a Hub model id: `owner/name` (letters,
/// digits, '-', '_', '.'; no leading '.' or '-'), optionally `@revision`.
bool is_repo_id(const std::string& name);

/// `path_or_id` when it exists on disk; else the cached snapshot folder of the
/// repo id it names (revision `main` unless `@revision` is given: a branch or
/// tag in refs/, or a commit hash in snapshots/); else nullopt.
std::optional<std::filesystem::path> resolve(const std::string& path_or_id);

/// resolve(path_or_id), or `path_or_id` unchanged when it resolves to nothing
/// (the caller's own "not found" error then names it as written).
std::filesystem::path local_path(const std::string& path_or_id);

/// Why `id` (a repo id that resolve() did not find) is missing: the folder
/// searched, the revisions it has, and the download command.
std::string explain_missing(const std::string& id);

}  // namespace anvil::hub

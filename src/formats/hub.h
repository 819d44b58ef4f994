// Hugging Face hub names (org/name, org/name@revision) resolved offline, through the local cache
// that huggingface_hub fills, laid out as it lays it out:
//   <root>/models--org--name/refs/<revision>           a text file holding a commit hash
//   <root>/models--org--name/snapshots/<commit>/<file>  symlinks to ../../blobs/<hash>
// Nothing here touches the network: a name not in the cache is an error saying how to fetch it.
// No torch, no CLI11.
#pragma once

#include <string>

namespace hs {

struct HubSnapshot {
    std::string repo;      // "org/name"
    std::string revision;  // the revision asked for: a branch, a tag or a commit hash ("main" by default)
    std::string commit;    // the commit hash the revision resolved to
    std::string folder;    // <root>/models--org--name/snapshots/<commit>
};

// The cache root, as huggingface_hub finds it: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (a leading ~
// expanded; an empty variable counts as unset). `from`, when given, is set to where the root came
// from ("HF_HUB_CACHE", ..., "the default").
std::string hub_cache_root(std::string* from = nullptr);

// Whether `spec` has the form of a hub name: org/name or org/name@revision, where org and name are
// what huggingface_hub accepts as a repo id's parts ([A-Za-z0-9_.-], no "--" or "..", neither starting
// nor ending with '-' or '.', 96 characters in all) and name has no checkpoint file extension
// (.bin, .safetensors, .gguf, .json: those are paths). Says nothing about whether it is cached.
bool looks_like_hub_name(const std::string& spec);

// Resolves a hub name through the cache: refs/<revision> gives the commit (a revision that is a full
// 40-character commit hash with a snapshots/<commit> folder resolves directly); checks that the
// snapshot folder exists and that none of the files a loader reads from it (config.json, weights,
// tokenizer files) is a link to a missing blob. Throws ModelLoadError, one line naming the cache
// root or the file and the problem, for a repository or revision not in the cache (with the
// `hf download` command that would fetch it), a ref file that is empty or holds no commit hash, a
// missing snapshot folder, a broken link; UsageError when `spec` is not a hub name.
HubSnapshot resolve_hub_name(const std::string& spec);

}  // namespace hs

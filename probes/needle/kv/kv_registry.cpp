// The KV-cache policies' registry (kv_policy.h): one row a policy, its file kv_<name>.cpp. A new policy
// is its file and its row here (docs/architecture.md, "A KV policy").
#include "kv_policy.h"

#include "errors.h"

namespace hs {

// Each defined in its policy's file.
const KvPolicy& kv_full();
const KvPolicy& kv_snapkv();
const KvPolicy& kv_headkv();
const KvPolicy& kv_duo();
const KvPolicy& kv_razor();
const KvPolicy& kv_stream();
const KvPolicy& kv_adakv();
const KvPolicy& kv_critical_adakv();

const std::vector<const KvPolicy*>& kv_policies() {
    static const std::vector<const KvPolicy*> rows = {
        &kv_full(),   // the whole cache
        &kv_snapkv(), // SnapKV, the same capacity every head
        &kv_headkv(), // HeadKV, capacities by an importance score
        &kv_duo(),    // DuoAttention, whole groups by the gates
        &kv_razor(),  // RazorAttention, whole groups by its head selection
        &kv_stream(), // stream:S, DuoAttention's deployment by any score
        &kv_adakv(),  // Ada-KV, SnapKV's scores selected across a layer's KV heads
        &kv_critical_adakv(),  // CriticalAdaKV, Ada-KV with the value norms' second stage
    };
    return rows;
}

const KvPolicy* find_kv_policy(const std::string& listed, std::string* arg) {
    for (const KvPolicy* p : kv_policies()) {
        const std::string name = p->name();
        if (p->score_from() != KvScoreFrom::kArgument) {
            if (listed == name) return p;
        } else if (listed.size() > name.size() + 1 && listed.compare(0, name.size() + 1, name + ":") == 0) {
            if (arg) *arg = listed.substr(name.size() + 1);
            return p;
        }
    }
    return nullptr;
}

std::string kv_policy_names() {
    std::string out;
    for (const KvPolicy* p : kv_policies())
        out += (out.empty() ? "" : ", ") + std::string(p->name()) + (p->score_from() == KvScoreFrom::kArgument ? ":SCORE" : "");
    return out;
}

std::string run_score_source(NeedleScore s) { return std::string("this run: scores/") + needle_score_name(s) + "/score"; }

at::Tensor KvPolicy::own_score(const Model&, const KvCompareSpec&, std::string*) const {
    HS_REQUIRE(false, "KvPolicy::own_score: a policy whose score_from() is kOwn defines it");
    return {};
}

}  // namespace hs

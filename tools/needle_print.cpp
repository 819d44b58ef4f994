// `retrieval`'s printed summary (needle_print.h): the protocol line, the accuracy, each score's
// top heads, the ablation and decoding sets, the stream sweep's curve. `headscope retrieval` prints
// them after the study ran.
#include "needle_print.h"

#include "atlas.h"
#include "heads.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

namespace hs {

// The protocol's resolved choices in one line (printed when --protocol is given or not headscope).
std::string needle_protocol_line(const NeedleProtocol& pr, const std::vector<int64_t>& stop_ids) {
    return fmt::format("protocol {}: context = length - {} tokens, assembly {} (ablation {}), insertion {}, answer span {}, "
                       "stop {} on ids {} ({}), {} steps (ablation {}), ablation scope {}, haystack {} {}, rng {}",
                       name_in(protocol_names(), pr.protocol), pr.buffer, name_in(assembly_names(), pr.assembly),
                       name_in(assembly_names(), pr.ablation_assembly), name_in(insertion_names(), pr.insertion),
                       name_in(answer_search_names(), pr.answer), stop_rule_name(pr.stop),
                       stop_ids.empty() ? std::string("none") : fmt::format("{}", fmt::join(stop_ids, ",")),
                       pr.stop_order == StopOrder::kAfter ? "kept and scored, then stop" : "unkept",
                       pr.max_new_tokens, pr.ablation_max_new_tokens, ablation_scope_name(pr.scope),
                       name_in(haystack_format_names(), pr.haystack_format), name_in(haystack_repeat_names(), pr.repeat),
                       name_in(rng_kind_names(), pr.rng));
}

// The printed summary: accuracy, the top heads of each score, the ablation sets' accuracies.
void print_needle_summary(const NeedleStudySpec& p, const NeedleStudy& scan, const NeedleSummary& sum, int L, int H) {
    const int64_t N = scan.results().N;
    if (p.shard.count > 1)
        std::printf("shard %s: trials %lld of %lld, passed %lld (accuracy %.3f, ROUGE-L F %.3f)\n", p.shard.str().c_str(),
                    static_cast<long long>(sum.n_done), static_cast<long long>(N), static_cast<long long>(sum.n_pass),
                    sum.accuracy, sum.rougeL);
    else
        std::printf("trials %lld, passed %lld (accuracy %.3f, ROUGE-L F %.3f)\n", static_cast<long long>(N),
                    static_cast<long long>(sum.n_pass), sum.accuracy, sum.rougeL);
    auto print_top = [&](const char* name, const at::Tensor& s) {
        std::string line = fmt::format("{:<10}", name);
        for (auto [l, h] : top_heads(s, std::min<int64_t>(5, L * H)))
            line += fmt::format(" {} {:.4f}", format_head(l, h), s[l][h].item<double>());
        std::printf("%s\n", line.c_str());
    };
    for (NeedleScore s : p.scores.list()) {  // registry order: retrieval (flagged), locos (its CI), r2
        print_top(needle_score_name(s), sum.score(s));
        if (s == NeedleScore::kRetrieval)
            std::printf("flagged (> %.2f): %s\n", p.flag_threshold,
                        sum.flagged.empty() ? "none" : fmt::format("{}", fmt::join(sum.flagged, ",")).c_str());
        if (s == NeedleScore::kLocos && !sum.with_ci && sum.n_locos > 0)
            std::printf("locos CI: not computed (%lld scored trials, the reference's minimum is %lld): NaN\n",
                        static_cast<long long>(sum.n_locos), static_cast<long long>(kBootstrapMinTrials));
    }
    // QRHead beside the other scores computed on the same trials: Spearman's rho over the L x H heads.
    if (p.scores.has(NeedleScore::kQrhead)) {
        auto flat = [](const at::Tensor& t) {
            const auto c = t.to(torch::kDouble).contiguous().view(-1);
            return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
        };
        std::printf("qrhead: mean over %lld trials (passing or not)\n", static_cast<long long>(sum.n_query));
        for (NeedleScore s : p.scores.list())
            if (s != NeedleScore::kQrhead)
                std::printf("Spearman's rho (%s, qrhead) over %d heads: %.4f\n", needle_score_name(s), L * H,
                            spearman(flat(sum.score(s)), flat(sum.score(NeedleScore::kQrhead))));
    }
    const auto& sets = scan.sets();
    // The ablation passes' own prompts (LOCOS) have their own unablated baseline: the last set.
    double base_acc = sum.accuracy, base_rl = sum.rougeL;
    if (!sets.empty() && sets.back().empty() && sets.size() > 1) base_acc = sum.abl_acc.back(), base_rl = sum.abl_rougeL.back();
    for (size_t si = 0; si < sets.size(); ++si) {
        if (sets[si].empty() && si > 0) {
            std::printf("ablation baseline %-24s accuracy %.3f (the ablation prompts, unablated; the scan's %.3f)  ROUGE-L F %.3f\n",
                        "(no heads)", sum.abl_acc[si], sum.accuracy, sum.abl_rougeL[si]);
            continue;
        }
        std::printf("ablation %s %-24s accuracy %.3f (baseline %.3f)  ROUGE-L F %.3f (baseline %.3f)\n",
                    si == 0 ? "heads  " : "control", format_heads(sets[si]).c_str(), sum.abl_acc[si], base_acc,
                    sum.abl_rougeL[si], base_rl);
    }
    if (const auto& d = scan.decoding()) {
        double base_margin = 0;
        for (const auto& t : d->trials[0]) base_margin += t.base_margin;
        base_margin /= std::max<size_t>(1, d->trials[0].size());
        for (size_t s = 0; s < d->sets.size(); ++s) {
            double acc = 0, rl = 0, mg = 0;
            for (const auto& t : d->trials[s]) acc += t.result.passed, rl += t.result.rougeL_f, mg += t.answer_margin;
            const double n = std::max<size_t>(1, d->trials[s].size());
            std::printf("decoding %s %s %-24s accuracy %.3f (greedy %.3f)  ROUGE-L F %.3f  answer margin %+.3f (greedy %+.3f)\n",
                        name_in(combine_rule_names(), d->spec.rule), s == 0 ? "heads  " : "control",
                        d->spec.rule == CombineRule::kJuice ? "(enhance/suppress)" : format_heads(d->sets[s]).c_str(),
                        acc / n, sum.accuracy, rl / n, mg / n, base_margin);
        }
    }
}

// The stream sweep's curve (run_needle_stream_sweep wrote it to /retrieval/streaming).
void print_stream_sweep(const NeedleStudySpec& s, const StreamSweep& sw, const std::string& source, const NeedleSummary& sum) {
    const int64_t R = static_cast<int64_t>(sw.orders.size()), F = static_cast<int64_t>(sw.fractions.size());
    std::printf("streaming sweep: sink %lld, recent %lld%s; order %s; %lld random order%s\n",
                static_cast<long long>(s.window.sink), static_cast<long long>(s.window.recent),
                s.window.compensate ? " + compensation" : "", source.c_str(), static_cast<long long>(s.random_orders),
                s.random_orders == 1 ? "" : "s");
    std::printf("%8s %6s %9s %9s %9s  %s\n", "full", "heads", "kv_budget", "accuracy", "ROUGE-L F", "random orders' accuracy");
    for (int64_t f = 0; f < F; ++f) {
        std::string rnd;
        for (int64_t r = 1; r < R; ++r) rnd += fmt::format("{}{:.3f}", r > 1 ? " " : "", sw.accuracy[r * F + f]);
        std::printf("%8.3f %6lld %9.3f %9.3f %9.3f  %s\n", sw.fractions[f], static_cast<long long>(sw.full_heads[f]),
                    sw.kv_budget[f], sw.accuracy[f], sw.rougeL_f[f], rnd.empty() ? "-" : rnd.c_str());
    }
    std::printf("baseline accuracy %.3f (every head full)\n", sum.accuracy);
}

}  // namespace hs

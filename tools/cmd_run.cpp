// headscope run: a masking/ablation experiment from YAML (docs/experiments.md) into HDF5
// (docs/hdf5-schema.md, "Ablation experiments"). The study is probes/ablation/ablation_study.h; this
// command parses, opens the model, checks a resumed file's identity, runs the study's batches through
// the job runner (the whole file rewritten atomically after every batch, so a killed run leaves the
// last complete file and --resume skips the configurations it records as done) and prints.
#include "ablation_records.h"
#include "ablation_study.h"
#include "attention_detectors.h"
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "experiment.h"
#include "heads.h"
#include "progress.h"
#include "run_state.h"
#include "schema.h"
#include "store.h"
#include "util.h"

#include <torch/torch.h>

#include <filesystem>

#include <cmath>

namespace hs::cli {

struct RunOptions {
    std::string file, model, out;
    bool resume = false, force = false, no_prefix_reuse = false;
    std::string shard;
    int64_t batch_rows = 0;
    int pause_ms = 0;
};

namespace {

bool higher_is_worse(const MetricSpec& m) { return m.kind == MetricKind::kLoss || m.kind == MetricKind::kKl; }

void print_summary(const StudyState& st) {
    const auto& c = st.cfg;
    auto metric = st.rows.mean(1);
    const int64_t S = metric.size(0);
    const double base = metric[0].item<double>();
    std::string line = fmt::format("{:<14} {} {}: baseline {:.4f}", st.spec->name, name_of(st.spec->metric.kind),
                                   name_of(st.spec->sweep), base);
    if (st.spec->sweep == SweepKind::kPrune) {
        for (int64_t i = 1; i < S; ++i) line += fmt::format("  {} {:.4f}", c.labels[i], metric[i].item<double>());
        std::printf("%s\n", line.c_str());
        return;
    }
    if (st.spec->sweep == SweepKind::kGating) {
        // Roles (the most frequent over the starts, with its count), then the causal checks' means.
        const auto& g = st.gating;
        const int64_t starts = g.roles.size(0), L = g.role.size(0), H = g.role.size(1);
        std::printf("%s\n", line.c_str());
        for (int k : {1, 2, 0, 3}) {
            std::string heads;
            for (int64_t l = 0; l < L; ++l)
                for (int64_t h = 0; h < H; ++h)
                    if (g.role[l][h].item<int>() == k)
                        heads += fmt::format(" {}({}/{})", format_head(static_cast<int>(l), static_cast<int>(h)),
                                             g.role_counts[k][l][h].item<int64_t>(), starts);
            if (!heads.empty()) std::printf("  %-13s%s\n", head_role_name(static_cast<HeadRole>(k)), heads.c_str());
        }
        for (const char* kind : {"circuit", "interfering"}) {
            double sum = 0;
            int n = 0;
            for (int64_t i = 1; i < S; ++i)
                if (c.kinds[i] == kind && !std::isnan(metric[i].item<double>())) sum += metric[i].item<double>(), ++n;
            if (n) std::printf("  check: %s  %.4f (mean over %d starts)\n",
                               std::string(kind) == "circuit" ? "heads with G- < 0.5 zeroed" : "heads with G+ < 0.5 zeroed",
                               sum / n, n);
        }
        return;
    }
    if (st.spec->sweep == SweepKind::kDuoGates) {
        // The learned order (highest alpha first), the distillation losses, then the configurations.
        const auto& d = st.duo;
        const int64_t L = d.alpha.size(0), H = d.alpha.size(1);
        std::printf("%s\n", line.c_str());
        auto order = d.alpha.reshape(-1).argsort(0, true);
        std::string heads;
        for (int64_t i = 0; i < std::min<int64_t>(8, L * H); ++i) {
            const int64_t j = order[i].item<int64_t>();
            heads += fmt::format(" {}={:.2f}", format_head(static_cast<int>(j / H), static_cast<int>(j % H)), d.alpha.view(-1)[j].item<double>());
        }
        std::printf("  alpha (highest):%s\n", heads.c_str());
        std::printf("  distillation loss: all full %.3g, all streaming %.3g, fitted %.3g\n", d.distill_full, d.distill_stream,
                    d.distill_final);
        double csum = 0;
        int cn = 0;
        for (int64_t i = 1; i < S; ++i) {
            if (c.kinds[i] == "control") {
                if (!std::isnan(metric[i].item<double>())) csum += metric[i].item<double>(), ++cn;
                continue;
            }
            std::printf("  %-40s %.4f\n", c.labels[i].c_str(), metric[i].item<double>());
        }
        if (cn) std::printf("  %-40s %.4f (mean over %d)\n", "random controls of the same size", csum / cn, cn);
        return;
    }
    // The most harmful non-control configurations first.
    std::vector<int64_t> idx;
    for (int64_t i = 1; i < S; ++i)
        if (c.kinds[i] != "control" && !std::isnan(metric[i].item<double>())) idx.push_back(i);
    const double sign = higher_is_worse(st.spec->metric) ? 1.0 : -1.0;
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
        return sign * metric[a].item<double>() > sign * metric[b].item<double>();
    });
    for (size_t i = 0; i < std::min<size_t>(5, idx.size()); ++i)
        line += fmt::format("  {} {:.4f}", c.labels[idx[i]], metric[idx[i]].item<double>());
    std::printf("%s\n", line.c_str());
}


// --out or the file's output: (a shard's name when sharded without --out); its folder is made when
// missing (output: out/x.h5 in a fresh clone).
std::string output_path(const RunOptions& o, const Experiment& e, const Shard& shard) {
    std::string out = !o.out.empty() ? o.out : e.output;
    if (out.empty()) throw UsageError(fmt::format("{}: no output: set output: in the file or pass --out", o.file));
    if (o.out.empty() && !o.shard.empty()) out = shard_path(out, shard);
    if (file_exists(out) && !o.resume && !o.force)
        throw StorageError(fmt::format("{}: exists (use --resume to continue it or --force to replace it)", out));
    const auto parent = std::filesystem::path(out).parent_path();
    if (!parent.empty() && !std::filesystem::exists(parent)) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec) throw StorageError(fmt::format("{}: cannot create the output folder {}: {}", out, parent.string(), ec.message()));
    }
    return out;
}

// --resume: refuses a file of another experiment (its YAML), model or shard, in that order.
void check_resumable(const ResultReader& r, const std::string& path, const Experiment& e, const Model& m, const Shard& shard) {
    const Attrs ea = schema::read_experiment(r);
    const jobs::Identity id{m.weights_sha256(), {{"sha256", sha256_bytes(e.text.data(), e.text.size())}}, {}, {}, shard.str()};
    const std::string stored_shard = ea.count("shard") ? attr_to_string(ea.at("shard")) : std::string();
    const auto d = compare_parts(schema::attr_text(r, schema::meta(), "weights_sha256"), ea, stored_shard, id);
    if (d.params)
        throw StorageError(fmt::format("{}: holds another experiment (its YAML differs from {}); refusing to resume", path, e.file));
    if (d.model) throw StorageError(fmt::format("{}: holds results of another model; refusing to resume", path));
    if (d.shard) throw StorageError(fmt::format("{}: was run as shard {}, not {}", path, stored_shard, shard.str()));
}

}  // namespace

void run_run(const RunOptions& o) {
    const Shard shard = o.shard.empty() ? Shard{} : parse_shard(o.shard);
    if (o.resume && o.force) throw UsageError("--resume and --force exclude each other");
    Experiment e = parse_experiment(o.file, detector_probe_names());
    if (!o.model.empty()) e.model = o.model;
    if (o.batch_rows > 0) e.batch_rows = o.batch_rows;
    const std::string out = output_path(o, e, shard);

    ModelArgs ma;
    ma.model = e.model, ma.tokenizer = e.tokenizer, ma.dtype = e.dtype, ma.device = e.device, ma.threads = e.threads;
    ma.attention = e.attention;
    Loaded l;
    try {
        l = open_model(ma, false);
    } catch (const ConfigError& ex) {
        e.fail(e.model_mark, ex.what());
    }
    const Model& m = *l.model;
    AblationStudy study(e, m, l.tokenizer.get(), !o.no_prefix_reuse);
    if (o.resume && file_exists(out)) {
        ResultReader r(out);
        check_resumable(r, out, e, m, shard);
        study.resume(r);
    }
    auto write = [&] {
        ResultWriter w(out, WriteMode::kForce);
        write_meta(w, m, e.seed);
        schema::write_ablation_run(w, study.records(shard));
        w.commit();
    };
    write();  // the file exists from here on, complete after every batch
    jobs::Checkpoint checkpoint(0, write, o.pause_ms);
    const int64_t ran = study.run(shard, checkpoint);
    for (const auto& st : study.studies()) print_summary(st);
    log_info("wrote {} ({} configurations run{})", out, ran, shard.count > 1 ? ", shard " + shard.str() : "");
}

void setup_run(CLI::App& app) {
    auto o = std::make_shared<RunOptions>();
    auto* sub = app.add_subcommand(
        "run",
        "run a masking/ablation experiment described in YAML (docs/experiments.md): datasets, probe scores,\n"
        "and studies (sweeps single, layer, set, cumulative, prune, scale-grid, gating, duo-gates; modes zero,\n"
        "mean, resample, scale, zero-query, mean-query, stream; metrics loss, accuracy, logit-diff, kl, prob), written to HDF5 under\n"
        "/ablation/<study>. The file is rewritten atomically after every batch of configurations: a killed\n"
        "run leaves the last complete file, and --resume continues it. --shard I/N runs the batches k of\n"
        "configurations one unsharded run forms with k % N == I; `headscope merge` joins the shards.\n"
        "A scale-grid study with metric prob on a conflicts dataset is JUICE's head selection\n"
        "(/ablation/<study>/juice/{enhance,suppress}); gating and duo-gates fit learned head gates first\n"
        "(/ablation/<study>/gates, /ablation/<study>/duo/alpha: a head order for retrieval --stream-sweep).\n"
        "Example: headscope run datasets/experiments/toy-induction.yaml");
    sub->add_option("experiment", o->file, "the experiment's YAML file")->required();
    sub->add_option("--model", o->model, "use this model instead of the file's model:");
    sub->add_option("-o,--out", o->out, "write here instead of the file's output:");
    sub->add_flag("--resume", o->resume, "continue an existing output file of the same experiment and model");
    sub->add_flag("--force", o->force, "replace an existing output file");
    sub->add_option("--shard", o->shard, "I/N: run every N-th configuration starting at I (output gets .shard-I-of-N "
                                         "unless --out is given); slurm: I and N from SLURM_ARRAY_TASK_ID and "
                                         "SLURM_ARRAY_TASK_COUNT; slurm/N: N given (a task resubmitted alone)");
    sub->add_option("--batch-rows", o->batch_rows, "rows per forward pass (configurations x dataset rows; default: "
                                                   "the file's batch_rows, else 64)");
    sub->add_flag("--no-prefix-reuse", o->no_prefix_reuse, "recompute the layers below the first ablated layer per "
                                                           "configuration (for checks and benchmarks)");
    sub->add_option("--pause-after-batch", o->pause_ms, "testing: sleep this many ms after each flushed batch")
        ->group("");
    sub->callback([o] { run_run(*o); });
}

}  // namespace hs::cli

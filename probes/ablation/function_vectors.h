// Function-vector heads (Todd et al., ICLR 2024, "Function Vectors in Large Language Models";
// ericwtodd/function_vectors; methods: docs/methods.md, "Function-vector heads"). A task is a list of
// word pairs (input -> output). Few-shot prompts are built with the reference's template
// ("Q: x\nA: y\n\n" n_shots times, then "Q: x_q\nA:"); the mean of every head's z (the input of
// o_proj) at the last token over clean prompts is put, one head at a time, at the last token of
// prompts whose labels are shuffled, and the indirect effect of the head is the rise of the
// probability of the query's answer (its first token); its mean over the corrupted prompts is the
// AIE. The sweep is exact patching with a fixed source (patching.h: heads x prompts as the rows of
// one forward, the layers below the patched one computed once).
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

class ResultWriter;

class Tokenizer;

struct WordPair {
    std::string input, output;
};
// A task file: a JSON list of {"input": TEXT, "output": TEXT} (the reference's dataset_files
// format), split into demonstrations and queries by FvOptions::test_split; or an object
// {"demonstrations": [...], "queries": [...]} of two such lists, the split given (the toy ICL tasks
// ask one query). DataError naming the file and the entry for a bad one.
struct FvTask {
    std::vector<WordPair> pairs;             // the list form
    std::vector<WordPair> train, valid;      // the object form
    bool split_given() const { return !valid.empty(); }
    size_t size() const { return pairs.size() + train.size() + valid.size(); }
};
FvTask read_fv_task(const std::string& path);

// The reference's prompt template (word_pairs_to_prompt_data's defaults): prefixes and separators,
// and a space before every input and output (prepend_space).
struct FvTemplate {
    std::string input_prefix = "Q:", output_prefix = "A:", input_sep = "\n", output_sep = "\n\n";
    bool prepend_space = true;
};
// The prompt text of demonstrations `demos` and query input `query` (create_prompt).
std::string fv_prompt_text(const std::vector<WordPair>& demos, const std::string& query, const FvTemplate& t);

struct FvOptions {
    int n_shots = 10;          // demonstrations a prompt (the reference's --n_shots)
    int n_trials = 25;         // clean prompts for the mean, and corrupted prompts for the AIE (--n_trials)
    double test_split = 0.3;   // the query pool's share of the pairs (--test_split)
    uint64_t seed = 42;        // headscope's own draw (std::mt19937_64), not numpy's
    FvTemplate tmpl;
    int64_t max_rows = 64;     // rows per forward (heads x prompts)
};

struct FvPrompts {
    std::vector<std::string> clean_text, corrupt_text;
    at::Tensor clean, corrupt;                        // [N, T] int64, right-padded with 0
    std::vector<int64_t> clean_lengths, corrupt_lengths;
    std::vector<int64_t> clean_answer, corrupt_answer;  // the first token of " " + output after the prompt
};
// The draws: the pairs split into demonstrations (train) and queries (valid) as
// train_test_split(test_size) sizes them (ceil for the queries); n_trials clean prompts (n_shots
// demonstrations without replacement, one query), then n_trials corrupted ones drawn the same way
// with the demonstrations' outputs permuted. Texts are encoded with BOS; the answer is the first
// token of encode(prompt + " " + output) past encode(prompt) (get_answer_id). DataError naming the
// task file when it has too few pairs or a prompt exceeds the model's context.
FvPrompts fv_prompts(const FvTask& task, const std::string& task_path, const Tokenizer& tok,
                     const ModelConfig& c, const FvOptions& o);

struct FvResult {
    at::Tensor aie;          // [L, H] float64: mean over corrupted prompts of p_patched - p_corrupt
    at::Tensor patched;      // [L, H] float64: mean p(answer) with the head's mean activation put in
    double p_clean = 0, p_corrupt = 0;   // mean p(answer) on the clean and on the corrupted prompts
    double top1_clean = 0;   // the clean prompts' top-1 accuracy on the answer's first token
    int64_t forwards = 0;
    double seconds_mean = 0, seconds_sweep = 0;
};
FvResult function_vector_heads(const Model& m, const FvPrompts& p, const FvOptions& o);

// One task's result as the file keeps it (src/store/score_records.h: /patching/<group>, the AIE, the
// run's settings and every prompt's tokens), written through w.
void write_fv_heads_result(ResultWriter& w, const std::string& group, const std::string& task, const FvOptions& o,
                           const FvPrompts& prompts, const FvResult& r);

// Several tasks' results as one (Todd et al. rank heads by the AIE averaged over the tasks): aie,
// patched, p_clean, p_corrupt and top1_clean summed in the tasks' order and divided by their count;
// forwards and seconds summed. At least one result.
FvResult fv_heads_mean(const std::vector<FvResult>& results);
// That mean as the file keeps it (src/store/score_records.h write_fv_heads_mean: /patching/<group>,
// the task files and their groups, in order, as attributes), written through w.
void write_fv_heads_mean_result(ResultWriter& w, const std::string& group, const std::vector<std::string>& tasks,
                                const std::vector<std::string>& task_groups, const FvResult& mean);

}  // namespace hs

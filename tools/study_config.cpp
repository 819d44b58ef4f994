// `--config STUDY.yaml` (study_config.h): CLI11 reads a configuration file through a Config
// formatter into the options of the subcommands it names; this formatter reads YAML, names the
// subcommand that was given, and refuses what the command line would not take.
#include "study_config.h"

#include "errors.h"
#include "guard.h"
#include "util.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <set>
#include <vector>

namespace hs::cli {

namespace {

std::string g_path, g_text;

std::string where(const YAML::Mark& m) {
    return m.line >= 0 ? fmt::format("{}:{}:{}", g_path, m.line + 1, m.column + 1) : g_path;
}

// The option a key names: `--key` (underscores read as dashes), or the positional called `key`.
const CLI::Option* find_option(const CLI::App* sub, const std::string& key) {
    if (const auto* o = sub->get_option_no_throw("--" + key)) return o;
    for (const auto* o : sub->get_options())
        if (o->get_positional() && o->get_name() == key) return o;
    return nullptr;
}

std::string key_of(const CLI::Option* o) {
    if (o->get_positional()) return o->get_name();
    const auto& lnames = o->get_lnames();
    return lnames.empty() ? o->get_name() : lnames.front();
}

// Options a study file does not set: the file itself, help, printing the file.
bool configurable(const CLI::Option* o) {
    const std::string k = key_of(o);
    return k != "config" && k != "help" && k != "help-all" && k != "print-config";
}

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

std::string nearest_key(const CLI::App* sub, const std::string& key) {
    std::string best;
    size_t best_d = 4;  // suggest only a near miss
    for (const auto* o : sub->get_options()) {
        if (!configurable(o)) continue;
        const size_t d = edit_distance(key, key_of(o));
        if (d < best_d) best_d = d, best = key_of(o);
    }
    return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

// One key's value as the option's inputs; false for a flag set to false (the flag is not given).
bool inputs_of(const YAML::Node& v, const CLI::Option* o, const std::string& key, std::vector<std::string>* out) {
    const bool flag = o->get_expected_min() == 0 && !o->get_positional();
    if (v.IsMap()) throw ConfigError(fmt::format("{}: '{}' takes a value or a list, not a mapping", where(v.Mark()), key));
    if (flag) {
        bool on = false;
        if (!v.IsScalar() || !YAML::convert<bool>::decode(v, on))
            throw ConfigError(fmt::format("{}: '{}' is a flag: true or false", where(v.Mark()), key));
        if (on) out->push_back("true");
        return on;
    }
    if (v.IsScalar()) {
        out->push_back(v.Scalar());
        return true;
    }
    if (v.size() == 0) throw ConfigError(fmt::format("{}: '{}' has an empty list", where(v.Mark()), key));
    std::vector<std::string> items;
    for (const auto& e : v) {
        if (!e.IsScalar()) throw ConfigError(fmt::format("{}: '{}': a list of plain values expected", where(e.Mark()), key));
        items.push_back(e.Scalar());
    }
    // An option of one value takes a list as the command line writes it: comma-separated
    // (`lengths: [300, 400]` is `--lengths 300,400`); an option of several values takes each.
    if (o->get_expected_max() < 2 && o->get_type_size_max() < 2) out->push_back(CLI::detail::join(items, ","));
    else out->insert(out->end(), items.begin(), items.end());
    return true;
}

class YamlStudy : public CLI::Config {
public:
    YamlStudy(CLI::App* root, std::set<const CLI::App*> subs) : root_(root), subs_(std::move(subs)) {}

    // The given options of the subcommand as a study file (what --print-config prints).
    std::string to_config(const CLI::App*, bool, bool, std::string) const override {
        const CLI::App* sub = given_sub();
        YAML::Emitter e;
        e << YAML::BeginMap;
        for (const auto* o : sub->get_options()) {
            if (o->count() == 0 || !configurable(o) || o->get_group().empty()) continue;
            e << YAML::Key << key_of(o) << YAML::Value;
            const auto& r = o->results();
            if (o->get_expected_min() == 0 && !o->get_positional()) e << true;
            else if (r.size() == 1) e << r[0];
            else e << YAML::Flow << r;
        }
        e << YAML::EndMap;
        return std::string(e.c_str()) + "\n";
    }

    std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
        if (g_text.empty()) g_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        const CLI::App* sub = given_sub();
        YAML::Node root;
        try {
            root = YAML::Load(g_text);
        } catch (const YAML::Exception& e) {
            throw ConfigError(fmt::format("{}: {}", where(e.mark), e.msg));
        }
        if (!root.IsMap())
            throw ConfigError(fmt::format("{}: a study file is a mapping of option names to values (e.g. 'lengths: [512, 1024]')", g_path));
        std::vector<CLI::ConfigItem> items;
        std::set<std::string> seen;
        for (const auto& kv : root) {
            std::string key = kv.first.Scalar();
            std::replace(key.begin(), key.end(), '_', '-');
            const CLI::Option* o = find_option(sub, key);
            if (!o || !configurable(o))
                throw ConfigError(fmt::format("{}: '{}' is not an option of `headscope {}`{}", where(kv.first.Mark()), kv.first.Scalar(),
                                              sub->get_name(), o ? "" : nearest_key(sub, key)));
            if (!seen.insert(key_of(o)).second)
                throw ConfigError(fmt::format("{}: '{}' is given twice", where(kv.first.Mark()), key));
            if (kv.second.IsNull()) throw ConfigError(fmt::format("{}: '{}' has no value", where(kv.first.Mark()), key));
            CLI::ConfigItem item;
            item.parents = {sub->get_name()};
            item.name = key_of(o);
            if (inputs_of(kv.second, o, key, &item.inputs)) items.push_back(std::move(item));
        }
        return items;
    }

private:
    const CLI::App* given_sub() const {
        for (const auto* s : root_->get_subcommands())
            if (subs_.count(s)) return s;
        throw UsageError("--config: a study file is read by `headscope retrieval --config FILE`");
    }

    CLI::App* root_;
    std::set<const CLI::App*> subs_;
};

}  // namespace

void add_study_config(CLI::App& root, CLI::App* sub) {
    static std::set<const CLI::App*> subs;
    subs.insert(sub);
    root.config_formatter(std::make_shared<YamlStudy>(&root, subs));
    // CLI11 reads a configuration file from the top-level app's option only: the subcommand's --config
    // hands its path there (the top-level one stays hidden).
    if (!root.get_config_ptr()) root.set_config("--config", "", "a study file for the subcommand")->group("");
    sub->add_option_function<std::string>(
           "--config",
           [&root](const std::string& path) {
               g_path = path;
               g_text = read_text_file(path);
               try {
                   check_utf8(g_text, path);
               } catch (const DataError& e) {
                   throw ConfigError(e.what());
               }
               if (g_text.empty()) throw ConfigError(fmt::format("{}: the study file is empty", path));
               root.get_config_ptr()->add_result(path);
           },
           "a study file (YAML): the options of this command as keys without the dashes, e.g. 'lengths: [512, 1024]'; "
           "options on the command line win over the file's (docs/experiments.md, \"Needle studies from a file\")")
        ->trigger_on_parse();
    sub->add_flag_callback(
        "--print-config", [&root] {
            std::fputs(root.get_config_formatter()->to_config(&root, false, false, "").c_str(), stdout);
            throw CLI::Success();
        },
        "print the options given (command line and --config) as a study file and exit");
}

const std::string& study_config_text() { return g_text; }

}  // namespace hs::cli

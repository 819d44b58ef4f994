// Successor task files (probes/weights/successor.cpp read_successor_tasks): a JSON object of ordered word
// lists. Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "successor.h"

#include <set>

HS_FUZZ_TARGET(successor_tasks) {
    const std::string path = hs_fuzz::write_temp("tasks.json", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("successor_tasks", {hs::ExitCode::kData}, [&] {
        const auto tasks = hs::read_successor_tasks(path);
        hs_fuzz::check(!tasks.empty(), "successor_tasks", "an empty task list was accepted");
        for (const auto& t : tasks) {
            hs_fuzz::check(t.words.size() >= 2, "successor_tasks", "a task of fewer than two words was accepted");
            // A last word equal to the first is a wrap-around (Sunday -> Monday); any other repeat is refused.
            const bool wrap = t.words.size() >= 3 && t.words.back() == t.words.front();
            const std::set<std::string> distinct(t.words.begin(), t.words.end() - (wrap ? 1 : 0));
            hs_fuzz::check(distinct.size() == t.words.size() - (wrap ? 1 : 0), "successor_tasks",
                           "a task with a repeated word was accepted");
        }
    });
}

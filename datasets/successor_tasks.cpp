#include "successor_tasks.h"

namespace hs::data {

const std::vector<std::pair<std::string, std::vector<std::string>>>& successor_tasks() {
    static const auto tasks = [] {
        std::vector<std::pair<std::string, std::vector<std::string>>> t;
        std::vector<std::string> numbers;
        for (int i = 1; i <= 200; ++i) numbers.push_back(std::to_string(i));
        t.push_back({"numbers", numbers});
        t.push_back({"number_words", {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                                      "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                                      "eighteen", "nineteen", "twenty"}});
        t.push_back({"cardinal_words", {"first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
                                        "ninth", "tenth"}});
        // The reference's order and wrap-arounds (curt-tigges/circuits-over-time test_successor_head.py
        // lines 11-19): days and months end on their first word again (Sunday -> Monday, December ->
        // January); the prefixes do not wrap.
        t.push_back({"days", {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "Monday"}});
        t.push_back({"months", {"January", "February", "March", "April", "May", "June", "July", "August", "September",
                                "October", "November", "December", "January"}});
        t.push_back({"day_prefixes", {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}});
        t.push_back({"month_prefixes", {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                        "Dec"}});
        std::vector<std::string> letters;
        for (char c = 'A'; c <= 'Z'; ++c) letters.push_back(std::string(1, c));
        t.push_back({"letters", letters});
        return t;
    }();
    return tasks;
}

}  // namespace hs::data

// SPDX-License-Identifier: Apache-2.0
//
// Codec parameters as they arrive at a factory: a flat JSON object whose values are strings,
// numbers, booleans or null. The SDK has already validated them against the codec's schema in
// Python; this parser exists so a native factory can read them without a JSON library and
// still refuse anything malformed with a clear message.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvcodec {

/// A parsed flat JSON object. Header-only; for use inside plugins, never across the ABI.
class CodecParams
{
public:
    struct Value
    {
        enum class Kind
        {
            kString,
            kNumber,
            kBool,
            kNull
        } kind;
        std::string text; ///< String contents, or the number's literal text.
        double number = 0;
        bool boolean = false;
    };

    /// Parses `json`. Returns false and sets `error` on malformed input or nested values.
    bool parse(char const* json, std::string& error)
    {
        values_.clear();
        p_ = json == nullptr ? "{}" : json;
        skipSpace();
        if (!consume('{'))
        {
            return fail(error, "parameters must be a JSON object");
        }
        skipSpace();
        if (consume('}'))
        {
            return trailing(error);
        }
        while (true)
        {
            skipSpace();
            std::string key;
            if (!parseString(key))
            {
                return fail(error, "expected a string key");
            }
            skipSpace();
            if (!consume(':'))
            {
                return fail(error, "expected ':' after key '" + key + "'");
            }
            skipSpace();
            Value v{};
            if (*p_ == '"')
            {
                v.kind = Value::Kind::kString;
                if (!parseString(v.text))
                {
                    return fail(error, "bad string value for '" + key + "'");
                }
            }
            else if (startsWith("true"))
            {
                v.kind = Value::Kind::kBool;
                v.boolean = true;
                p_ += 4;
            }
            else if (startsWith("false"))
            {
                v.kind = Value::Kind::kBool;
                p_ += 5;
            }
            else if (startsWith("null"))
            {
                v.kind = Value::Kind::kNull;
                p_ += 4;
            }
            else if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9'))
            {
                char* end = nullptr;
                v.kind = Value::Kind::kNumber;
                v.number = std::strtod(p_, &end);
                if (end == p_)
                {
                    return fail(error, "bad number for '" + key + "'");
                }
                v.text.assign(p_, static_cast<size_t>(end - p_));
                p_ = end;
            }
            else
            {
                return fail(error, "value of '" + key + "' must be a string, number, boolean or null");
            }
            values_[key] = v;
            skipSpace();
            if (consume(','))
            {
                continue;
            }
            if (consume('}'))
            {
                return trailing(error);
            }
            return fail(error, "expected ',' or '}' after value of '" + key + "'");
        }
    }

    [[nodiscard]] bool has(std::string const& key) const
    {
        return values_.count(key) != 0;
    }

    [[nodiscard]] std::optional<std::string> getString(std::string const& key) const
    {
        auto it = values_.find(key);
        if (it == values_.end() || it->second.kind != Value::Kind::kString)
        {
            return std::nullopt;
        }
        return it->second.text;
    }

    [[nodiscard]] std::optional<double> getNumber(std::string const& key) const
    {
        auto it = values_.find(key);
        if (it == values_.end() || it->second.kind != Value::Kind::kNumber)
        {
            return std::nullopt;
        }
        return it->second.number;
    }

    [[nodiscard]] std::optional<bool> getBool(std::string const& key) const
    {
        auto it = values_.find(key);
        if (it == values_.end() || it->second.kind != Value::Kind::kBool)
        {
            return std::nullopt;
        }
        return it->second.boolean;
    }

    [[nodiscard]] std::map<std::string, Value> const& values() const
    {
        return values_;
    }

private:
    bool fail(std::string& error, std::string const& what)
    {
        error = "malformed codec parameters: " + what;
        return false;
    }

    bool trailing(std::string& error)
    {
        skipSpace();
        return *p_ == '\0' ? true : fail(error, "unexpected text after the object");
    }

    void skipSpace()
    {
        while (*p_ == ' ' || *p_ == '\n' || *p_ == '\t' || *p_ == '\r')
        {
            ++p_;
        }
    }

    bool consume(char c)
    {
        if (*p_ != c)
        {
            return false;
        }
        ++p_;
        return true;
    }

    bool startsWith(char const* word) const
    {
        size_t i = 0;
        for (; word[i] != '\0'; ++i)
        {
            if (p_[i] != word[i])
            {
                return false;
            }
        }
        return true;
    }

    // Parameter strings are identifiers and names: escapes other than \" \\ \/ are refused.
    bool parseString(std::string& out)
    {
        if (!consume('"'))
        {
            return false;
        }
        out.clear();
        while (*p_ != '"')
        {
            if (*p_ == '\0')
            {
                return false;
            }
            if (*p_ == '\\')
            {
                ++p_;
                if (*p_ != '"' && *p_ != '\\' && *p_ != '/')
                {
                    return false;
                }
            }
            out.push_back(*p_++);
        }
        ++p_;
        return true;
    }

    std::map<std::string, Value> values_;
    char const* p_ = "";
};

/// A codec parameter refused by ParamReader; the message names the codec, the key and the value.
struct ParamError : std::invalid_argument
{
    using std::invalid_argument::invalid_argument;
};

/// Typed reading of a codec's parameters, for a factory (see makeCodecFactory in codec_base.h).
///
/// The parameter schema (types, defaults, ranges, choices, documentation) has one source: the
/// codec's Python spec, which validates user input and sends every parameter, defaults filled in.
/// A native caller may omit keys; the field then keeps its initial value. The reader refuses what
/// would make a typed value meaningless (malformed JSON, a wrong type, a fraction for an integer,
/// a value outside the C++ type, a string outside an enum's mapping, an unknown key) and leaves
/// semantic checks the schema cannot express (a multiple of 16, one field smaller than another)
/// to the codec, through refuse().
class ParamReader
{
public:
    /// Parses `json` (null reads as "{}"); throws ParamError when it is malformed.
    ParamReader(char const* codec, char const* json)
        : codec_(codec == nullptr ? "codec" : codec)
    {
        std::string error;
        if (!params_.parse(json, error))
        {
            throw ParamError(error);
        }
    }

    /// Reads `key` into `value` when present: bool, an integer type, a floating type or
    /// std::string. Throws ParamError on a wrong type or a value `T` cannot hold.
    template <class T>
    void read(char const* key, T& value)
    {
        if (std::find(known_.begin(), known_.end(), key) == known_.end())
        {
            known_.emplace_back(key);
        }
        auto it = params_.values().find(key);
        if (it == params_.values().end() || it->second.kind == CodecParams::Value::Kind::kNull)
        {
            return;
        }
        auto const& v = it->second;
        if constexpr (std::is_same_v<T, bool>)
        {
            if (v.kind != CodecParams::Value::Kind::kBool)
            {
                refuse(key, "it must be true or false");
            }
            value = v.boolean;
        }
        else if constexpr (std::is_integral_v<T>)
        {
            double const n = v.number;
            if (v.kind != CodecParams::Value::Kind::kNumber || n != std::floor(n)
                || n < double(std::numeric_limits<T>::lowest()) || n >= std::ldexp(1.0, std::numeric_limits<T>::digits))
            {
                refuse(key,
                    std::is_unsigned_v<T> && sizeof(T) == 8
                        ? std::string("it must be an integer >= 0")
                        : "it must be an integer in [" + std::to_string(std::numeric_limits<T>::lowest()) + ", "
                            + std::to_string(std::numeric_limits<T>::max()) + "]");
            }
            value = T(n);
        }
        else if constexpr (std::is_floating_point_v<T>)
        {
            if (v.kind != CodecParams::Value::Kind::kNumber || !std::isfinite(v.number))
            {
                refuse(key, "it must be a finite number");
            }
            value = T(v.number);
        }
        else
        {
            static_assert(std::is_same_v<T, std::string>, "ParamReader::read: bool, integer, floating or std::string");
            if (v.kind != CodecParams::Value::Kind::kString)
            {
                refuse(key, "it must be a string");
            }
            value = v.text;
        }
    }

    /// Reads the string `key` into the enum (or any) `value` through `options` (text -> value)
    /// when present; throws ParamError naming the valid texts otherwise.
    template <class E>
    void choice(char const* key, E& value, std::initializer_list<std::pair<char const*, E>> options)
    {
        std::string valid;
        for (auto const& option : options)
        {
            valid += (valid.empty() ? "'" : ", '") + std::string(option.first) + "'";
        }
        std::string text;
        bool const present = has(key);
        try
        {
            read(key, text);
        }
        catch (ParamError const&)
        {
            refuse(key, "valid values are " + valid); // Not a string: still say what is valid.
        }
        if (!present)
        {
            return;
        }
        for (auto const& [name, option] : options)
        {
            if (text == name)
            {
                value = option;
                return;
            }
        }
        refuse(key, "valid values are " + valid);
    }

    /// Reads the string `key`, a comma-separated list, into its items (trimmed of spaces and
    /// tabs, empty items dropped) when present.
    void readList(char const* key, std::vector<std::string>& items)
    {
        std::string text;
        read(key, text);
        items.clear();
        size_t begin = 0;
        while (begin <= text.size())
        {
            size_t end = text.find(',', begin);
            end = end == std::string::npos ? text.size() : end;
            size_t const first = text.find_first_not_of(" \t", begin);
            if (first != std::string::npos && first < end)
            {
                items.push_back(text.substr(first, text.find_last_not_of(" \t", end - 1) - first + 1));
            }
            begin = end + 1;
        }
    }

    /// Throws ParamError "<codec> parameter '<key>' <what>; <why>": for one item of a list.
    [[noreturn]] void refuseItem(char const* key, std::string const& what, std::string const& why) const
    {
        throw ParamError(codec_ + " parameter '" + key + "' " + what + "; " + why);
    }

    /// True when `key` is present (and not null).
    [[nodiscard]] bool has(char const* key) const
    {
        auto it = params_.values().find(key);
        return it != params_.values().end() && it->second.kind != CodecParams::Value::Kind::kNull;
    }

    /// Throws ParamError "<codec> parameter '<key>' is <value>; <why>" (strings shown unquoted).
    [[noreturn]] void refuse(char const* key, std::string const& why) const
    {
        auto it = params_.values().find(key);
        std::string shown = "absent";
        if (it != params_.values().end())
        {
            auto const& v = it->second;
            shown = v.kind == CodecParams::Value::Kind::kBool ? std::string(v.boolean ? "true" : "false")
                : v.kind == CodecParams::Value::Kind::kNull   ? std::string("null")
                                                              : v.text;
        }
        throw ParamError(codec_ + " parameter '" + key + "' is " + shown + "; " + why);
    }

    /// Throws ParamError for the first key no read()/choice() asked for, listing the known ones
    /// in the order they were read.
    void finish() const
    {
        for (auto const& [key, value] : params_.values())
        {
            if (std::find(known_.begin(), known_.end(), key) == known_.end())
            {
                std::string valid;
                for (auto const& k : known_)
                {
                    valid += (valid.empty() ? "'" : ", '") + k + "'";
                }
                throw ParamError("unknown " + codec_ + " parameter '" + key + "'; valid parameters are "
                    + (valid.empty() ? std::string("none") : valid));
            }
        }
    }

private:
    std::string codec_;
    CodecParams params_;
    std::vector<std::string> known_; ///< In the order the codec reads them.
};

} // namespace kvcodec

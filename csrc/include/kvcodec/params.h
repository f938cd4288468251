// SPDX-License-Identifier: Apache-2.0
//
// Codec parameters as they arrive at a factory: a flat JSON object whose values are strings,
// numbers, booleans or null. The SDK has already validated them against the codec's schema in
// Python; this parser exists so a native factory can read them without a JSON library and
// still refuse anything malformed with a clear message.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace kvcodec {

/// A parsed flat JSON object. Header-only; for use inside plugins, never across the ABI.
class CodecParams
{
public:
    struct Value
    {
        enum class Kind { kString, kNumber, kBool, kNull } kind;
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

} // namespace kvcodec

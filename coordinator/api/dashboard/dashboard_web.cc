#include "coordinator/api/dashboard/dashboard_web.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain::coordinator {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  // The length is not secret enough to hide; the contents are compared in full.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

// The token as the cookie holds it: hex, so no byte of it is special to a cookie
// (; , space) or to cpp-httplib, which %-decodes header values as it reads them.
std::string Hex(absl::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace

std::string PercentEncode(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::optional<std::string> PercentDecode(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      const int hi = HexValue(text[i + 1]), lo = HexValue(text[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::optional<std::string> FormField(absl::string_view body, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(body, '&')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first == name) return PercentDecode(kv.second);
  }
  return std::nullopt;
}

std::optional<std::string> CookieValue(absl::string_view header, absl::string_view name) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.first == name) return std::string(kv.second);
  }
  return std::nullopt;
}

bool CookieHoldsToken(absl::string_view cookie_header, const std::string& token) {
  if (token.empty()) return false;
  std::optional<std::string> value = CookieValue(cookie_header, kDashboardCookie);
  return value && ConstantTimeEqual(*value, Hex(token));
}

std::string LoginCookie(const std::string& token) {
  return absl::StrCat(kDashboardCookie, "=", Hex(token),
                      "; Path=/; HttpOnly; SameSite=Strict");
}

std::string SafeNextPath(absl::string_view next) {
  // "//host" and "/\host" are other sites to a browser; so is anything with a scheme.
  if (next.empty() || next[0] != '/' || (next.size() > 1 && (next[1] == '/' || next[1] == '\\'))) {
    return "/";
  }
  for (char c : next) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '\\') return "/";
  }
  return std::string(next);
}

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

namespace {

std::string Page(absl::string_view title, absl::string_view body) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>", title, "</title><link rel=\"stylesheet\" href=\"/dashboard.css\"></head>"
      "<body><header><h1><a href=\"/\">pipetrain</a></h1></header><main>", body,
      "</main></body></html>\n");
}

}  // namespace

std::string LoginPage(absl::string_view next, absl::string_view error) {
  return Page(
      "pipetrain: log in",
      absl::StrCat(
          "<section id=\"login\"><h2>Log in</h2>",
          error.empty() ? "" : absl::StrCat("<p class=\"error\" id=\"login-error\">",
                                            HtmlEscape(error), "</p>"),
          "<p>This coordinator requires its token (the contents of its --token-file).</p>"
          "<form method=\"post\" action=\"/login\">"
          "<input type=\"hidden\" name=\"next\" value=\"", HtmlEscape(SafeNextPath(next)), "\">"
          "<label>Token <input type=\"password\" name=\"token\" id=\"token\" "
          "autocomplete=\"current-password\" autofocus></label> "
          "<button type=\"submit\" id=\"login-submit\">Log in</button></form></section>"));
}

std::string UnknownJobPage(absl::string_view job_id) {
  return Page("pipetrain: no such job",
              absl::StrCat("<section id=\"not-found\"><h2>404: no such job</h2><p>The "
                           "coordinator has no job '", HtmlEscape(job_id),
                           "'. <a href=\"/\">All jobs</a></p></section>"));
}

}  // namespace pipetrain::coordinator

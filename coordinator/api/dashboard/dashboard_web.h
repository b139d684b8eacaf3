// What the coordinator's dashboard needs of HTTP besides routing, as pure functions:
// the login cookie (its value, reading it back from a Cookie header, the token check
// in constant time), the login form's body, where to go after logging in, and the
// small HTML pages (login form, unknown job). http_api.cc only calls these.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

namespace pipetrain::coordinator {

inline constexpr char kDashboardCookie[] = "pipetrain_token";

// %XX for every byte but A-Z a-z 0-9 - . _ ~ (a form field's value).
std::string PercentEncode(absl::string_view text);
// The inverse; '+' is a space (form encoding). nullopt for a malformed %XX.
std::optional<std::string> PercentDecode(absl::string_view text);

// The value of field `name` in an application/x-www-form-urlencoded body, decoded.
std::optional<std::string> FormField(absl::string_view body, absl::string_view name);
// The value of cookie `name` in a Cookie header ("a=1; b=2"), still encoded.
std::optional<std::string> CookieValue(absl::string_view header, absl::string_view name);

// Whether the Cookie header carries the login cookie holding `token`; compares in time
// independent of where the values differ. False for an empty token.
bool CookieHoldsToken(absl::string_view cookie_header, const std::string& token);

// The Set-Cookie value that logs a browser in: the token in hex; HttpOnly (no script
// reads it), SameSite=Strict (no other site's page sends it), for every path.
std::string LoginCookie(const std::string& token);

// Where to send the browser after logging in: `next` if it is a path of this server
// ("/jobs/job-000001"), else "/" (no open redirect to another site).
std::string SafeNextPath(absl::string_view next);

std::string HtmlEscape(absl::string_view text);

// The login form, posting the token to /login and returning to `next`; `error` (empty:
// none) is shown above it.
std::string LoginPage(absl::string_view next, absl::string_view error);
// The page for /jobs/ID of a job the coordinator does not know.
std::string UnknownJobPage(absl::string_view job_id);

}  // namespace pipetrain::coordinator

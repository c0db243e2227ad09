// Package console holds the web console's browser test:
// a real 3-node cluster in this process (real memberlist on loopback, real
// HTTP, real bbolt files, real delivery targets) and Debian's chromium
// driven by chromedp, doing what an operator does on /ui/.
//
// It needs a chromium (or google-chrome) binary on PATH. Without one the
// test skips saying so, unless FAIRSHARD_REQUIRE_BROWSER is set (CI sets
// it: .ci/run installs chromium), when it fails. FAIRSHARD_CONSOLE_SCREENSHOT
// names where to write the screenshot (README's docs/console.png is made
// that way); by default it goes to the test's temporary directory.
package console

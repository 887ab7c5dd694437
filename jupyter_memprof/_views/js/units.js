// Units for people, in the page: the same rules, and the same float operations, as
// jupyter_memprof/_units.py (format_bytes, format_ms, format_records), so a number reads the same in a
// table built in Python and in a tooltip built here. tests/test_browser_code.py
// (test_page_and_python_format_numbers_the_same) runs both.
/* exported format_bytes, format_ms, format_records */

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

// x >= 0 to `digits` decimals, rounded half up as floor(x * 10 ** digits + 0.5);
// returns [the scaled integer, the text]
const fixed = (x, digits) => {
  const scale = 10 ** digits;
  const k = Math.floor(x * scale + 0.5);
  if (!digits) return [k, String(k)];
  return [k, `${Math.floor(k / scale)}.${String(k % scale).padStart(digits, "0")}`];
};

// 4000 -> "3.9 KiB"; bytes below 1 KiB exactly, else one decimal in binary units
const format_bytes = (value) => {
  let n = Math.trunc(Number(value));
  const sign = n < 0 ? "-" : "";
  n = Math.abs(n);
  if (n < 1024) return `${sign}${n} B`;
  let exp = 0;
  while (n >= 1024 ** (exp + 1) && exp < UNITS.length - 1) exp++;
  let [k, text] = fixed(n / 1024 ** exp, 1);
  if (k >= 10240 && exp < UNITS.length - 1) {
    exp++;
    [k, text] = fixed(n / 1024 ** exp, 1);
  }
  return `${sign}${text} ${UNITS[exp]}`;
};

// a time in ms on the capture's clock, to the microsecond; "" when not a number
const format_ms = (ms) => {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  const sign = ms < 0 ? "-" : "";
  const a = Math.abs(ms);
  if (a < 1) {
    const [k, text] = fixed(a * 1000, 1);
    if (k < 10000) return `${sign}${text} µs`;
  }
  if (a < 1000) {
    const [k, text] = fixed(a, 3);
    if (k < 1000000) return `${sign}${text} ms`;
  }
  return `${sign}${fixed(a / 1000, 3)[1]} s`;
};

// a place on an estimate's clock, which counts records, not time: "record #1,234"
const format_records = (ms) => {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  const k = Math.floor(Math.abs(ms) + 0.5);
  return `record #${ms < 0 && k ? "-" : ""}${k.toLocaleString("en-US")}`;
};

// A byte count in a timeline tooltip (CustomJSHover).
/* global value, format_bytes */

return format_bytes(value);

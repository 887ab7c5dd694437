// A byte count on a timeline's y axis (CustomJSTickFormatter).
/* global tick, format_bytes */

return format_bytes(tick);

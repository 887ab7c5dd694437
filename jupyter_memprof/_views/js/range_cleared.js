// "Clear time filter", or the timeline's reset tool: every op and block shown again.
/* global alloc_filter, op_filter, filter_info, filter_hint */

alloc_filter.booleans = null;
op_filter.booleans = null;
filter_info.text = filter_hint;

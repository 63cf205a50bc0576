/* status.c — names and descriptions of status codes and node states.
 *
 * Both come from the one X-macro table in cgtree.h, so a new status code
 * cannot be added without its name and description.
 */
#include "cgtree.h"

const char *cgt_status_name(cgt_status s) {
  switch (s) {
#define CGT__STATUS_NAME(name, text) \
  case CGT_##name:                   \
    return "CGT_" #name;
    CGT_STATUS_MAP(CGT__STATUS_NAME)
#undef CGT__STATUS_NAME
  default:
    return "CGT_UNKNOWN_STATUS";
  }
}

const char *cgt_status_string(cgt_status s) {
  switch (s) {
#define CGT__STATUS_TEXT(name, text) \
  case CGT_##name:                   \
    return text;
    CGT_STATUS_MAP(CGT__STATUS_TEXT)
#undef CGT__STATUS_TEXT
  default:
    return "unknown status code";
  }
}

const char *cgt_node_state_name(cgt_node_state s) {
  switch (s) {
  case CGT_NODE_WARMUP:
    return "WARMUP";
  case CGT_NODE_RECORDED:
    return "RECORDED";
  case CGT_NODE_EAGER:
    return "EAGER";
  }
  return "UNKNOWN";
}

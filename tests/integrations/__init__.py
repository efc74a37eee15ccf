# The tool names both integrations must expose (issue: integrations), spelled out here
# rather than taken from the code under test.
TOOL_NAMES = {
    "svc_create_channel",
    "svc_invite",
    "svc_join",
    "svc_send",
    "svc_receive",
    "svc_list_channels",
    "svc_send_envelope",
    "svc_receive_envelopes",
}

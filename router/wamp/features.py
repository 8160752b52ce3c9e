"""The roles and features this router announces in WELCOME (only what is implemented)."""

BROKER_FEATURES = {
    "publisher_identification": True,
    "pattern_based_subscription": True,
    "subscriber_blackwhite_listing": True,
    "publisher_exclusion": True,
    "subscription_meta_api": True,
    "session_meta_api": True,
    "event_retention": True,
    "event_history": True,
    "x_acknowledged_event_delivery": True,
    "x_shared_group": True,
    "subscription_revocation": True,
    "payload_passthru_mode": True,
    "payload_transparency": True,
}

DEALER_FEATURES = {
    "caller_identification": True,
    "progressive_call_results": True,
    "call_canceling": True,
    "call_timeout": True,
    "shared_registration": True,
    "pattern_based_registration": True,
    "session_meta_api": True,
    "testament_meta_api": True,
    "registration_revocation": True,
    "payload_passthru_mode": True,
    "payload_transparency": True,
}

ROUTER_ROLES = {
    "broker": {"features": BROKER_FEATURES},
    "dealer": {"features": DEALER_FEATURES},
}

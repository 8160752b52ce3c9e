"""Webhooks out: a realm subscriber whose events are POSTed as JSON to a URL.

Start here: :mod:`router.webhooks.webhook` (the subscriber, its queue and retries);
:mod:`router.webhooks.event` says what is sent (the body, the signature headers) and
:mod:`router.webhooks.client` how (Twisted's ``Agent``, one pooled connection per webhook).
"""

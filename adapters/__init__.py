"""Provider adapters: the edge where provider protocols live, one provider per
module (``apns``, ``fcm``, ``sms_twilio``, ``sms_vendor``, ``email_smtp``,
``webhook``, ``inbox``), behind the :class:`~adapters.base.Provider`
interface; receipt verification in ``receipts``; pure resilience logic
(token bucket, circuit breaker, failover policy) in ``resilience``; local
simulators of every provider in ``simulators``.

Pointing an adapter at the real endpoint with real credentials is a
configuration change: see :func:`adapters.registry.build_provider`.
"""

from .base import AttemptResult, PermanentKind, Provider, QueryResult, QueryStatus, SendResult

__all__ = ["AttemptResult", "PermanentKind", "Provider", "QueryResult", "QueryStatus", "SendResult"]

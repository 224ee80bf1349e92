"""The hosted e-mail and SMS APIs' simulators together: SendGrid, Amazon SES (with
its SNS notification topic) and Amazon SNS SMS, on 127.0.0.1.

They are not part of :func:`adapters.simulators.start_all` (the default routes of
``notify run`` do not use them); start them for a config that routes to kinds
``sendgrid``, ``ses`` or ``sns``::

    sims = await start_cloud("http://127.0.0.1:8080/v1/receipts")   # events → <url>/sendgrid, <url>/ses
    providers = sims.build_providers()        # {"sendgrid": …, "ses": …, "sns": …}
    verifier = sims.receipt_verifier()        # the SendGrid key, the SES topic, the simulator's cert URL
    await sims.stop()

or standalone: ``python -m adapters.simulators.cloud [--receipts-url URL] [--clean]
[--seed N] [--info PATH]`` prints (and writes to ``--info``) one JSON line with the
URLs and generated credentials (:meth:`CloudSims.as_dict`), and serves until
interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional

from ..base import Provider
from ..receipts import MemoryReplayGuard, ReceiptVerifier, ReplayGuard
from ..sendgrid import SendGridConfig, SendGridProvider
from ..ses import SesConfig, SesProvider
from ..sns import SnsSmsConfig, SnsSmsProvider
from .common import SimProfile
from .group import SimGroup, add_standalone_args, profile_of, receipt_url, run_standalone
from .sendgrid_sim import SendGridSim
from .ses_sim import SesSim
from .sns_sim import SnsSim

__all__ = ["CloudSims", "start_cloud", "cloud_configs_from_info", "build_cloud_providers_from_info"]

FROM = "notify@example.com"


@dataclass
class CloudSims(SimGroup):
    sendgrid: SendGridSim
    ses: SesSim
    sns: SnsSim
    receipts_url: Optional[str] = None
    _started: list[Any] = field(default_factory=list, repr=False)

    @property
    def all(self) -> dict[str, Any]:
        return {"sendgrid": self.sendgrid, "ses": self.ses, "sns": self.sns}

    def as_dict(self) -> dict[str, Any]:
        return {
            "receipts_url": self.receipts_url,
            "sendgrid": {**self.sendgrid.credentials(), "base_url": self.sendgrid.base_url},
            "ses": {**self.ses.credentials(), "base_url": self.ses.base_url},
            "sns": {**self.sns.credentials(), "base_url": self.sns.base_url},
        }

    def provider_configs(self, timeout: float = 5.0) -> dict[str, Any]:
        return cloud_configs_from_info(self.as_dict(), timeout)

    def build_providers(self, timeout: float = 5.0) -> dict[str, Provider]:
        return build_cloud_providers_from_info(self.as_dict(), timeout)

    def receipt_verifier(self, guard: Optional[ReplayGuard] = None, **kw: Any) -> ReceiptVerifier:
        return ReceiptVerifier(sendgrid_public_key=self.sendgrid.public_key, sns_topic_arns=(self.ses.topic_arn,),
                               sns_cert_urls=(self.ses.base_url + "/",), guard=guard or MemoryReplayGuard(), **kw)


def cloud_configs_from_info(info: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Adapter configs for the simulators :meth:`CloudSims.as_dict` describes."""
    sg, ses, sns = info["sendgrid"], info["ses"], info["sns"]
    return {
        "sendgrid": SendGridConfig(api_key=sg["api_key"], from_addr=FROM, base_url=sg["base_url"],
                                   event_webhook_public_key=sg["event_webhook_public_key"], timeout=timeout),
        "ses": SesConfig(region=ses["region"], access_key_id=ses["access_key_id"],
                         secret_access_key=ses["secret_access_key"], from_addr=FROM, base_url=ses["base_url"],
                         sns_topic_arns=(ses["sns_topic_arn"],), sns_cert_urls=(ses["base_url"] + "/",),
                         timeout=timeout),
        "sns": SnsSmsConfig(region=sns["region"], access_key_id=sns["access_key_id"],
                            secret_access_key=sns["secret_access_key"], base_url=sns["base_url"], timeout=timeout),
    }


def build_cloud_providers_from_info(info: dict[str, Any], timeout: float = 5.0) -> dict[str, Provider]:
    c = cloud_configs_from_info(info, timeout)
    return {"sendgrid": SendGridProvider(c["sendgrid"]), "ses": SesProvider(c["ses"]), "sns": SnsSmsProvider(c["sns"])}


async def start_cloud(receipts_url: Optional[str] = None, *, profile: Optional[SimProfile] = None,
                      host: str = "127.0.0.1", **kw: Any) -> CloudSims:
    """Start the three on ``host`` (ephemeral ports). ``receipts_url``: SendGrid's
    events go to ``<url>/sendgrid``, SES's SNS messages to ``<url>/ses``; ``kw``:
    ``sendgrid={…}``, ``ses={…}``, ``sns={…}`` extra arguments of each simulator."""
    profile = profile or SimProfile.realistic()
    sims = CloudSims(
        sendgrid=SendGridSim(profile, host=host, receipts_url=receipt_url(receipts_url, "sendgrid"),
                             **kw.get("sendgrid", {})),
        ses=SesSim(profile, host=host, receipts_url=receipt_url(receipts_url, "ses"), **kw.get("ses", {})),
        sns=SnsSim(profile, host=host, **kw.get("sns", {})),
        receipts_url=receipts_url,
    )
    sims.seed_rngs(profile, 100)
    await sims.start_each()
    return sims


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m adapters.simulators.cloud")
    add_standalone_args(p, "events go to <url>/sendgrid and <url>/ses")
    args = p.parse_args()
    asyncio.run(run_standalone(lambda: start_cloud(args.receipts_url, profile=profile_of(args)), args.info))


if __name__ == "__main__":
    main()

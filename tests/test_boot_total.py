"""A boot-log parser error never takes the daemon down: the arm is ``unknown`` with the error
as evidence (the arm runner journals it as ``boot-failed:unknown``), even when the engine
answered its readiness probe."""
from __future__ import annotations

import arms.boot
from arms.boot import BootLimits, boot_arm
from arms.profiles import load_profile
from arms.shape import Shape
from host.fake import FakeHost, FakeRun
from tests.faultengine import FaultEngine

DIGEST = "sha256:" + "12" * 32


class Blind(FakeHost):
    def port_holder(self, port: int) -> str | None:      # the fault engine stands in for the arm
        return None


def test_a_parser_error_makes_the_arm_unknown_with_evidence(tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise ValueError("could not convert string to float: '1.2.3'")
    monkeypatch.setattr(arms.boot, "parse_boot_log", broken)
    with FaultEngine(model="/m.gguf") as eng:             # serves the arm's model: it is the arm
        port = int(eng.url.rsplit(":", 1)[1])
        host = Blind(images={"localhost/e:1": DIGEST},
                     program=lambda spec: FakeRun(["main: server is listening on http://127.0.0.1:8080"]))
        shape = Shape(image=f"localhost/e@{DIGEST}", model="/m.gguf", port=port, args={})
        with boot_arm(host, shape, load_profile("llamacpp"), campaign="total", arm=1, folder=tmp_path,
                      limits=BootLimits(timeout_s=5, hang_s=5, poll_s=0.05)) as (result, booted):
            assert booted.ready.ready                     # the engine answered ...
    assert result.outcome == "unknown"                    # ... but its boot could not be explained
    assert result.report.evidence == ("boot-log parser failed: ValueError: could not convert string "
                                      "to float: '1.2.3'",)

"""``atmostonce demo --platform email`` end to end through main(): throwaway Postfix and Dovecot on loopback,
sends through the SMTP fault relay on the Outbox service with SQLite, and duplicates counted by Message-ID
in the Dovecot mailbox (the Maildir's own files), never from atmostonce's counters."""

from __future__ import annotations

import json
from collections import Counter

from atmostonce_cli.main import EXIT_OK, EXIT_STORE, main
from atmostonce_email import demo as email_demo
from atmostonce_email import servers as mail_servers_module


def test_the_email_demo_reports_zero_duplicates_counted_in_the_mailbox(capsys, monkeypatch):
    seen = {}
    real_census = mail_servers_module.MailServers.mailbox_census

    def census(self):  # keep what the mailbox held, to check the report against it
        seen["census"] = real_census(self)
        return seen["census"]

    monkeypatch.setattr(mail_servers_module.MailServers, "mailbox_census", census)
    rc = main(["--json", "demo", "--platform", "email", "-n", "12", "--workers", "3", "--seed", "7"])
    out = json.loads(capsys.readouterr().out)
    assert rc == EXIT_OK, out
    assert (out["ok"], out["finished"], out["duplicates"], out["duplicate_keys"]) == (True, True, 0, [])
    assert out["intents"] == 12 and sum(out["by_state"].values()) == 12
    assert sum(out["faults"].values()) > 0, out["faults"]  # the relay did inject faults
    census: Counter[str] = seen["census"]
    assert census and max(census.values()) == 1  # the mailbox's own count: every Message-ID once
    assert out["messages_in_mailbox"] == sum(census.values()) == out["creates"]
    assert out["by_state"]["published"] == out["creates"] - out["parked_with_object"]
    assert out["published_without_object"] == 0
    assert "spec/platforms/email.toml" in out["platform"]


def test_the_email_demo_says_why_and_exits_3_when_the_mail_servers_cannot_start(capsys, monkeypatch):
    monkeypatch.setattr(mail_servers_module.os, "geteuid", lambda: 1000)
    rc = main(["demo", "--platform", "email", "-n", "3"])
    err = capsys.readouterr().err
    assert rc == EXIT_STORE == 3
    assert "cannot start Postfix and Dovecot" in err and "root" in err
    monkeypatch.undo()
    monkeypatch.setattr(email_demo, "unavailable_reason", lambda: "postfix is not installed (Debian: postfix)")
    assert main(["--json", "demo", "--platform", "email", "-n", "3"]) == 3
    assert "postfix is not installed" in json.loads(capsys.readouterr().out)["platform_error"]

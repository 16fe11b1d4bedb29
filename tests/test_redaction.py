"""Redaction: secrets leave as placeholders, and the model's answer gets the originals back."""

import pytest

from engram.domain.redaction import redact

# Fake credentials in the real formats, assembled at run time so that secret scanners reading
# this file have nothing to flag.
OPENAI_KEY = "sk-" + "x7Qm2Lp9Rt4Vw8Yz1Ab3T3BlbkFJCd5Ef7Gh9Jk2Mn4Pq6"
OPENAI_PROJECT_KEY = "sk-proj-" + "4fGh8Jk2Lm6Np0Qr4St8Uv2Wx6Yz0Ab4Cd8Ef2Gh6Ij0Kl4Mn8Op2Qr6St0Uv4Wx8Yz2_aB-cD"
ANTHROPIC_KEY = "sk-ant-api03-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe9Dc8Ba7-AbCdEfGh12345678AA"
GITHUB_CLASSIC = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GITHUB_OAUTH = "gho_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
GITHUB_APP = "ghs_" + "16C7e42F292c6912E7710c838347Ae178B4a"
GITHUB_FINE_GRAINED = ("github_pat_" + "11ABCDEFG0123456789abc_"
                       + "dEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOpQrStUv")
SLACK_BOT = "xoxb-" + "1234567890123-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_USER = "xoxp-" + "2345678901234-2345678901234-2345678901234-" + "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_TEMPORARY_KEY_ID = "ASIA" + "Y34FZKBOKMUTVV7A"
AWS_SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
GOOGLE_KEY = "AIza" + "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"
STRIPE_LIVE = "sk_live_" + "51H8xYzAbCdEfGhIjKlMnOpQr0123456789"
STRIPE_RESTRICTED = "rk_live_" + "51H8xYzQrStUvWxYz0123456789AbCdEf"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
       ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
       ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
RSA_KEY = ("-----BEGIN RSA PRIVATE KEY-----\n"
           "MIIEowIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi+1kSaSR+lJYYc2dPyUaYy1Qjo\n"
           "Zp1b2Gq8i8kQ7Rx0yE7k2Cq1x0eQk6s6aA0E3bF1fXcD8wq9T1kQ3S5w8S1yQ==\n"
           "-----END RSA PRIVATE KEY-----")
OPENSSH_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
               "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
               "QyNTUxOQAAACBQ3sq2Zz3A4f5m1bOq7w6uO2nQ0c9v0nDq5d8v8X3p9wAAAJg7m6x0O5us\n"
               "-----END OPENSSH PRIVATE KEY-----")


@pytest.mark.parametrize("text, secret, kind", [
    (f"My OpenAI key is {OPENAI_KEY}, keep it safe.", OPENAI_KEY, "API_KEY"),
    (f"The project key {OPENAI_PROJECT_KEY} is for the billing bot.", OPENAI_PROJECT_KEY, "API_KEY"),
    (f"Claude runs with {ANTHROPIC_KEY}.", ANTHROPIC_KEY, "API_KEY"),
    (f"git clone with {GITHUB_CLASSIC} as the token", GITHUB_CLASSIC, "API_KEY"),
    (f"the OAuth app got {GITHUB_OAUTH}", GITHUB_OAUTH, "API_KEY"),
    (f"CI uses {GITHUB_APP} during a run", GITHUB_APP, "API_KEY"),
    (f"fine-grained PAT: {GITHUB_FINE_GRAINED}", GITHUB_FINE_GRAINED, "API_KEY"),
    (f"The Slack bot posts with {SLACK_BOT}", SLACK_BOT, "API_KEY"),
    (f"my Slack user token ({SLACK_USER}) expires soon", SLACK_USER, "API_KEY"),
    (f"AWS access key id {AWS_KEY_ID} in us-east-1", AWS_KEY_ID, "API_KEY"),
    (f"The STS session gave {AWS_TEMPORARY_KEY_ID} for an hour.", AWS_TEMPORARY_KEY_ID, "API_KEY"),
    (f"Maps calls use {GOOGLE_KEY}", GOOGLE_KEY, "API_KEY"),
    (f"Stripe live key {STRIPE_LIVE} goes in the vault", STRIPE_LIVE, "API_KEY"),
    (f"The reporting job has {STRIPE_RESTRICTED}.", STRIPE_RESTRICTED, "API_KEY"),
    (f"The session cookie holds {JWT} today.", JWT, "TOKEN"),
    ("curl -H 'Authorization: Bearer 8f3a9c2e7b1d4f6a0c5e9b2d7a3f1c8e' https://api.example.com",
     "8f3a9c2e7b1d4f6a0c5e9b2d7a3f1c8e", "TOKEN"),
    ("call it with Bearer a1b2c3d4e5f6.g7h8i9", "a1b2c3d4e5f6.g7h8i9", "TOKEN"),
    (f"Deploy key for staging:\n{RSA_KEY}\nUse it only from the bastion.", RSA_KEY, "PRIVATE_KEY"),
    (f"{OPENSSH_KEY}\n", OPENSSH_KEY, "PRIVATE_KEY"),
    ("The app connects to postgres://engram:Tr0ub4dor&3@db.internal:5432/memories daily.",
     "Tr0ub4dor&3", "PASSWORD"),
    ("The NAS is at smb://alice:p@ss:w0rd@nas.local/share", "p@ss:w0rd", "PASSWORD"),
    ("wifi password=correct-horse-battery-staple for the guest network",
     "correct-horse-battery-staple", "PASSWORD"),
    ("router passwd: Winter2024#, admin user is root", "Winter2024#", "PASSWORD"),
    ("Guest wifi (password: sunshine42) is on the fridge.", "sunshine42", "PASSWORD"),
    ("DB_PASS='s3cr3t-Pa55 word' in the .env", "s3cr3t-Pa55 word", "PASSWORD"),
    ('{"username": "alice", "password": "p@ss w0rd with spaces"}', "p@ss w0rd with spaces", "PASSWORD"),
    ("Use `--password=hunter2hunter2` when prompted.", "hunter2hunter2", "PASSWORD"),
    ("The webhook secret=9c1fe2a7b3d44e5f8a6b0c7d9e1f2a3b signs each call",
     "9c1fe2a7b3d44e5f8a6b0c7d9e1f2a3b", "SECRET"),
    (f"aws_secret_access_key = {AWS_SECRET_KEY}", AWS_SECRET_KEY, "SECRET"),
    ("clientSecret: Qm9vbGVhbkNsaWVudFNlY3JldA", "Qm9vbGVhbkNsaWVudFNlY3JldA", "SECRET"),
    ("weather api_key=3f9a7c1e5b2d8f4a6c0e9b7d5a3f1c2e (free tier)", "3f9a7c1e5b2d8f4a6c0e9b7d5a3f1c2e", "API_KEY"),
    ("X-Api-Key: live-4f2a9b7c1d3e5f60", "live-4f2a9b7c1d3e5f60", "API_KEY"),
    ("https://hooks.example.com/notify?channel=ops&token=tk4f2a9b7c1d3e5f60", "tk4f2a9b7c1d3e5f60", "TOKEN"),
    ("GITHUB_TOKEN: deadbeefcafe0123", "deadbeefcafe0123", "TOKEN"),
])
def test_each_kind_of_secret_is_replaced_by_a_numbered_placeholder(text, secret, kind):
    redacted = redact(text)

    placeholder = f"[{kind}_1]"
    assert redacted.text == text.replace(secret, placeholder)
    assert redacted.secrets == {placeholder: secret}
    assert redacted.restore(redacted.text) == text


def test_a_labelled_key_is_one_secret_not_two():
    text = f"export OPENAI_API_KEY={OPENAI_KEY}"

    redacted = redact(text)

    assert redacted.text == "export OPENAI_API_KEY=[API_KEY_1]"
    assert redacted.secrets == {"[API_KEY_1]": OPENAI_KEY}


def test_only_the_password_of_a_url_is_replaced():
    redacted = redact("postgres://engram:Tr0ub4dor&3@db.internal:5432/memories")

    assert redacted.text == "postgres://engram:[PASSWORD_1]@db.internal:5432/memories"


def test_a_private_key_block_is_replaced_whole_armour_lines_included():
    redacted = redact(f"Deploy key:\n{RSA_KEY}\nUse it from the bastion.")

    assert redacted.text == "Deploy key:\n[PRIVATE_KEY_1]\nUse it from the bastion."
    assert "PRIVATE KEY" not in redacted.text


def test_a_private_key_cut_short_is_redacted_to_the_end_of_the_text():
    truncated = RSA_KEY.split("-----END")[0]
    text = f"Here is half the key: {truncated} and some words after it"

    redacted = redact(text)

    assert redacted.text == "Here is half the key: [PRIVATE_KEY_1]"
    assert redacted.restore(redacted.text) == text


def test_placeholders_in_a_rephrased_answer_are_restored():
    redacted = redact(f"Remember that my OpenAI key is {OPENAI_KEY} and the NAS password: Winter2024#")

    answer = "The user's NAS password is [PASSWORD_1]. The user's key is [API_KEY_1]."

    assert redacted.restore(answer) == f"The user's NAS password is Winter2024#. The user's key is {OPENAI_KEY}."


def test_mangled_invented_and_dropped_placeholders_are_left_as_they_are():
    redacted = redact(f"my key is {OPENAI_KEY}")

    answer = "Keys: [api_key_1], [API_KEY_7], [API KEY 1], API_KEY_1 and [SECRET_1]."

    assert redacted.restore(answer) == answer
    assert redacted.restore("The user has a key.") == "The user has a key."
    assert redacted.restore("") == ""


def test_a_repeated_secret_shares_one_placeholder_and_numbering_follows_first_appearance():
    text = f"{GITHUB_CLASSIC} first, then {OPENAI_KEY}, then {GITHUB_CLASSIC} again"

    redacted = redact(text)

    assert redacted.text == "[API_KEY_1] first, then [API_KEY_2], then [API_KEY_1] again"
    assert redacted.secrets == {"[API_KEY_1]": GITHUB_CLASSIC, "[API_KEY_2]": OPENAI_KEY}
    assert redacted.restore(redacted.text) == text


def test_a_secret_mentioned_again_without_its_label_is_redacted_there_too():
    text = "The vault password=Tr0ub4dor&3 and I wrote Tr0ub4dor&3 on a sticky note; Tr0ub4dor&3x is another."

    redacted = redact(text)

    assert redacted.text == ("The vault password=[PASSWORD_1] and I wrote [PASSWORD_1] on a sticky note; "
                             "Tr0ub4dor&3x is another.")


def test_terms_are_matched_in_any_case_as_whole_words_longest_first():
    text = "Falcon Nine ships in May; FALCON-lite follows. Falconry is a hobby."

    redacted = redact(text, terms=["falcon", "Falcon Nine", "", "   "])

    assert redacted.text == "[REDACTED_1] ships in May; [REDACTED_2]-lite follows. Falconry is a hobby."
    assert redacted.secrets == {"[REDACTED_1]": "Falcon Nine", "[REDACTED_2]": "FALCON"}
    assert redacted.restore(redacted.text) == text


def test_terms_with_punctuation_at_an_edge_still_match():
    redacted = redact("Ask in #ops-private about C++ builds.", terms=["#ops-private", "C++"])

    assert redacted.text == "Ask in [REDACTED_1] about [REDACTED_2] builds."


@pytest.mark.parametrize("text", [
    "My password is in the drawer.",
    "The sky-blue walls of the kitchen.",
    "We use sk-learn-compatible-estimators everywhere.",
    "Order 123e4567-e89b-12d3-a456-426614174000 shipped on Tuesday.",
    "Email alice@example.com about the invoice.",
    "Bearer instruments were popular in 1920.",
    "The model runs with max_tokens: 4096 and temperature: 0.2.",
    "The tokenizer: bpe with 50k merges, token_count: 812.",
    "Visit http://localhost:8080/docs and https://example.com/a?b=c for details.",
    "Key points: ship Friday, review Monday.",
    "Passwords should be long; a secret is only safe when nobody else knows it.",
    "The API key rotation happens every 90 days, says the secret_name field.",
    "Forgot it? password_reset_url: https://example.com/reset",
    "Meeting at 10:30, room B; ratio 3:1.",
])
def test_ordinary_text_is_left_alone(text):
    redacted = redact(text)

    assert redacted.text == text
    assert redacted.secrets == {}


def test_placeholder_like_text_already_in_the_input_is_not_confused_with_a_placeholder():
    text = f"Template: put [API_KEY_1] where the key goes, password: [PASSWORD_1]. Mine is {OPENAI_KEY}."

    redacted = redact(text)

    assert redacted.text == "Template: put [API_KEY_1] where the key goes, password: [PASSWORD_1]. Mine is [API_KEY_2]."
    assert redacted.secrets == {"[API_KEY_2]": OPENAI_KEY}
    assert redacted.restore(redacted.text) == text
    assert redacted.restore("Key [API_KEY_2]; template [API_KEY_1].") == f"Key {OPENAI_KEY}; template [API_KEY_1]."


def test_a_text_full_of_secrets_round_trips_and_sends_none_of_them():
    secrets = [OPENAI_KEY, ANTHROPIC_KEY, GITHUB_FINE_GRAINED, SLACK_BOT, AWS_KEY_ID, GOOGLE_KEY, STRIPE_LIVE,
               JWT, OPENSSH_KEY, "Tr0ub4dor&3", "hunter2hunter2", "8f3a9c2e7b1d4f6a0c5e9b2d7a3f1c8e", "Falcon"]
    text = (f"Notes for the Falcon migration.\nOpenAI {OPENAI_KEY}, Anthropic {ANTHROPIC_KEY}.\n"
            f"GitHub {GITHUB_FINE_GRAINED}; Slack {SLACK_BOT}; AWS {AWS_KEY_ID}; Google {GOOGLE_KEY}.\n"
            f"Stripe {STRIPE_LIVE}, session {JWT}\n{OPENSSH_KEY}\n"
            "db: mysql://root:Tr0ub4dor&3@10.0.0.5/app, admin password: hunter2hunter2, "
            "Authorization: Bearer 8f3a9c2e7b1d4f6a0c5e9b2d7a3f1c8e. Falcon ships in May.")

    redacted = redact(text, terms=["falcon"])

    assert [secret for secret in secrets if secret in redacted.text] == []
    assert redacted.restore(redacted.text) == text
    assert sorted(redacted.secrets.values()) == sorted(secrets)


def test_logging_a_redaction_shows_counts_per_kind_never_the_secrets():
    redacted = redact(f"{OPENAI_KEY} {GITHUB_CLASSIC} {OPENAI_KEY} password=hunter2hunter2")

    assert redacted.kinds == {"API_KEY": 2, "PASSWORD": 1}
    assert [s for s in (OPENAI_KEY, GITHUB_CLASSIC, "hunter2hunter2") if s in repr(redacted)] == []
    assert redact("nothing to hide").kinds == {}


# Inputs that make a pattern with nested or overlapping quantifiers backtrack exponentially or
# quadratically. Redaction has to get through each of them, and still round-trip.
@pytest.mark.parametrize("text", [
    "sk-" + "a" * 32_000,
    "sk-" + "a-" * 16_000 + "1",
    "-----BEGIN PRIVATE KEY-----" * 1_200,
    "-----BEGIN " + "A " * 16_000,
    "a://b:" + "c" * 32_000,
    "https://u:" + "@" * 32_000,
    "password=" * 3_600,
    'password: "' * 2_900,
    "x" + "a-" * 16_000,
    "eyJ" + "a." * 16_000,
    "eyJaaaa.eyJ" * 3_000,
    "[A_" * 11_000,
    "Bearer " * 4_600,
    "xoxb-" * 6_400,
    "".join(f"pwd={i:06d}x " for i in range(2_900)),
])
def test_adversarial_inputs_are_redacted_without_runaway_matching(text):
    redacted = redact(text, terms=["a", "aa"])

    assert redacted.restore(redacted.text) == text

"""The object stores the tests run against, each a real API server on 127.0.0.1 (tests/conftest.py starts
them: s3_server, gcs_server, azure_server; ``bucket`` gives a new bucket on each in turn)."""

# URL scheme -> the session fixture of its server
STORES = {"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}

# Azurite's development account and key, published in its documentation (not a secret); the tests check
# that the key, which sits in AZURE_STORAGE_CONNECTION_STRING while Azurite runs, appears in no message.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

import os

# Offline and quiet before any library is imported.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK": "true",
    "TQDM_DISABLE": "1",
}.items():
    os.environ.setdefault(key, value)

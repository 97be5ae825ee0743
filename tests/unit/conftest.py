import sys
from pathlib import Path

# The collection is importable as ansible_collections.torchherd.cluster from a checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "collection"))

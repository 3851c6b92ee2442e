"""Convert MoleculeNet BBBP (BBBP.csv) into a Parquet graph collection.

Usage (needs RDKit, pyarrow; not part of the project's own environment):

    python3.11 -m venv /tmp/rdkit-venv
    /tmp/rdkit-venv/bin/pip install rdkit pyarrow numpy
    /tmp/rdkit-venv/bin/python datasets/bbbp/convert.py /path/to/BBBP.csv

Writes graphs.parquet, nodes.parquet and edges.parquet next to this file (zstd, one row group)
and prints the counts and the molecules RDKit could not parse. See README.md for the schemas.
"""

from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import rdkit
from rdkit import Chem, RDLogger
from rdkit.Chem.Scaffolds.MurckoScaffold import MurckoScaffoldSmiles

OUT_DIR = Path(__file__).resolve().parent
FRAC_TRAIN, FRAC_VALID = 0.8, 0.1


def read_rows(path: Path) -> list[dict[str, str]]:
    # newline="" lets csv handle the CRLF line ends and the quoted names ("""1,1,1-Tri...""").
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [h.strip().lower() for h in next(reader)]  # some copies spell it "SMILES"
        for col in ("num", "name", "p_np", "smiles"):
            if col not in header:
                raise SystemExit(f"{path}: no column {col!r} in header {header}")
        return [dict(zip(header, r)) for r in reader]


def scaffold_split(scaffolds: dict[int, str], n: int) -> dict[int, str]:
    """Deterministic Bemis-Murcko scaffold split, exactly the DeepChem / OGB (pretrain-gnns) rule.

    Groups sorted by (size, first index) in *descending* order, i.e. largest first and, among
    groups of equal size, the one whose first molecule comes later in the file goes first.
    A group goes to train if it fits under 80 % of n, else to val if it fits under 90 %, else test.
    """
    groups: dict[str, list[int]] = {}
    for idx, scaf in scaffolds.items():
        groups.setdefault(scaf, []).append(idx)
    ordered = sorted((sorted(v) for v in groups.values()), key=lambda v: (len(v), v[0]), reverse=True)
    train_cut, valid_cut = FRAC_TRAIN * n, (FRAC_TRAIN + FRAC_VALID) * n
    split: dict[int, str] = {}
    n_train = n_valid = 0
    for g in ordered:
        if n_train + len(g) > train_cut:
            if n_train + n_valid + len(g) > valid_cut:
                name = "test"
            else:
                name, n_valid = "val", n_valid + len(g)
        else:
            name, n_train = "train", n_train + len(g)
        for idx in g:
            split[idx] = name
    return split


def write(table: pa.Table, name: str) -> None:
    pq.write_table(table, OUT_DIR / name, compression="zstd", row_group_size=max(1, table.num_rows))


def main(csv_path: str) -> None:
    RDLogger.DisableLog("rdApp.*")
    rows = read_rows(Path(csv_path))

    g_id, g_label = [], []
    n_gid, n_nid, n_z, n_deg, n_chg, n_hs, n_aro, n_hyb = ([] for _ in range(8))
    e_gid, e_src, e_dst, e_bt = [], [], [], []
    scaffolds: dict[int, str] = {}
    dropped = []

    for i, row in enumerate(rows):  # graph_id = 0-based data row index in the CSV
        mol = Chem.MolFromSmiles(row["smiles"])
        if mol is None or mol.GetNumAtoms() == 0:
            dropped.append((i, row["num"], row["name"], row["p_np"], row["smiles"]))
            continue
        g_id.append(i)
        g_label.append(int(row["p_np"]))
        scaffolds[i] = MurckoScaffoldSmiles(mol=mol, includeChirality=False)
        for atom in mol.GetAtoms():  # GetAtoms() is in index order 0..n-1
            n_gid.append(i)
            n_nid.append(atom.GetIdx())
            n_z.append(atom.GetAtomicNum())
            n_deg.append(atom.GetDegree())
            n_chg.append(atom.GetFormalCharge())
            n_hs.append(atom.GetTotalNumHs())
            n_aro.append(int(atom.GetIsAromatic()))
            n_hyb.append(int(atom.GetHybridization()))
        bonds = sorted(
            (b.GetBeginAtomIdx(), b.GetEndAtomIdx(), int(round(b.GetBondTypeAsDouble() * 2))) for b in mol.GetBonds()
        )
        for s, d, bt in bonds:
            e_gid.append(i)
            e_src.append(s)
            e_dst.append(d)
            e_bt.append(bt)

    split = scaffold_split(scaffolds, len(g_id))
    i64 = pa.int64()
    graphs = pa.table(
        {
            "graph_id": pa.array(g_id, i64),
            "label": pa.array(g_label, i64),
            "split": pa.array([split[i] for i in g_id], pa.string()),
        }
    )
    nodes = pa.table(
        {
            "graph_id": pa.array(n_gid, i64),
            "node_id": pa.array(n_nid, i64),
            "atom_type": pa.array(n_z, i64),
            "degree": pa.array(n_deg, i64),
            "formal_charge": pa.array(n_chg, i64),
            "num_hs": pa.array(n_hs, i64),
            "aromatic": pa.array(n_aro, i64),
            "hybridization": pa.array(n_hyb, i64),
        }
    )
    edges = pa.table(
        {
            "graph_id": pa.array(e_gid, i64),
            "src": pa.array(e_src, i64),
            "dst": pa.array(e_dst, i64),
            "bond_type": pa.array(e_bt, i64),
        }
    )
    write(graphs, "graphs.parquet")
    write(nodes, "nodes.parquet")
    write(edges, "edges.parquet")

    print(f"rdkit {rdkit.__version__}, pyarrow {pa.__version__}")
    print(f"rows {len(rows)}, graphs {graphs.num_rows}, nodes {nodes.num_rows}, edges {edges.num_rows}")
    print(f"dropped {len(dropped)} (row index, num, name, p_np, smiles):")
    for d in dropped:
        print("  ", d)
    labels = dict(zip(g_id, g_label))
    for s in ("train", "val", "test"):
        ids = [i for i in g_id if split[i] == s]
        c = Counter(labels[i] for i in ids)
        print(f"{s}: {len(ids)} graphs, label 1: {c[1]}, label 0: {c[0]}")
    print(
        "distinct scaffolds:",
        len(set(scaffolds.values())),
        "acyclic (empty scaffold):",
        sum(1 for v in scaffolds.values() if v == ""),
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])

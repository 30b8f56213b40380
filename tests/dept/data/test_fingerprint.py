from pathlib import Path

from dept.data.fingerprint import BLOCK_BYTES, file_key, files_key


def test_a_file_is_known_by_name_size_and_sampled_content(tmp_path: Path) -> None:
    data = bytes(range(256)) * (BLOCK_BYTES // 16)  # 16 blocks' worth
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "train.txt").write_bytes(data)
    assert file_key(tmp_path / "a" / "train.txt") == file_key(tmp_path / "b" / "train.txt")
    edited = bytearray(data)
    edited[len(data) // 2] ^= 1  # the middle lies in a sampled block
    (tmp_path / "b" / "train.txt").write_bytes(bytes(edited))
    assert file_key(tmp_path / "a" / "train.txt") != file_key(tmp_path / "b" / "train.txt")
    (tmp_path / "a" / "val.txt").write_bytes(data)
    assert file_key(tmp_path / "a" / "val.txt") != file_key(tmp_path / "a" / "train.txt")


def test_the_order_of_files_counts(tmp_path: Path) -> None:
    one, two = tmp_path / "1.txt", tmp_path / "2.txt"
    one.write_text("one")
    two.write_text("two")
    assert files_key([one, two]) != files_key([two, one])
    assert files_key([tmp_path / "1.txt"]) == files_key([one])

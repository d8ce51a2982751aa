#!/bin/sh
# Builds the carry bundle for tests/bench/vs_llmc.sh (zrun next to llm.c on the GPU machine): the
# files train_gpt2cu needs, taken from bare git mirrors, plus the GPT-2 tokenizer and WikiText-2.
# Nothing in it is committed (third-party sources): the folder is git-ignored (.git/info/exclude).
#   sh tests/bench/llmc_bundle.sh [OUT_DIR=.llmc] [MIRRORS=/work/.mirror] [DATA=../shared/data]
# MIRRORS holds karpathy+llm.c/repo and NVIDIA+cudnn-frontend/repo (bare git directories, e.g. from
# the `fetch` tool on github:karpathy/llm.c and github:NVIDIA/cudnn-frontend). LLMC_REF (default
# HEAD) and FRONTEND_REF (default v1.15.0, the frontend released with cuDNN 9.14) pick the commits.
# OUT_DIR/: llm.c/{Makefile,train_gpt2.cu,llmc/}, cudnn-frontend/include/,
#           data/{gpt2_tokenizer.json,wiki.valid.raw}, SOURCES (the commits it was made from).
set -e
out=${1:-.llmc}; mirrors=${2:-/work/.mirror}; data=${3:-../shared/data}
llmc_ref=${LLMC_REF:-HEAD}; fe_ref=${FRONTEND_REF:-v1.15.0}
llmc_git=$mirrors/karpathy+llm.c/repo; fe_git=$mirrors/NVIDIA+cudnn-frontend/repo
for g in "$llmc_git" "$fe_git"; do
  git --git-dir="$g" rev-parse -q --verify "HEAD^{commit}" >/dev/null 2>&1 ||
    { echo "llmc_bundle: no git mirror at $g; fetch github:karpathy/llm.c and github:NVIDIA/cudnn-frontend first" >&2; exit 1; }
done
tok=$data/tokenizers/gpt2/tokenizer.json; raw=$data/wikitext-2-raw/wiki.valid.raw
for f in "$tok" "$raw"; do
  [ -f "$f" ] || { echo "llmc_bundle: $f not found; pass the shared data folder as the third argument" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/llm.c" "$out/cudnn-frontend" "$out/data"
git --git-dir="$llmc_git" archive "$llmc_ref" Makefile train_gpt2.cu llmc | tar -x -C "$out/llm.c"
git --git-dir="$fe_git" archive "$fe_ref" include | tar -x -C "$out/cudnn-frontend"
cp "$tok" "$out/data/gpt2_tokenizer.json"
cp "$raw" "$out/data/wiki.valid.raw"
{
  echo "llm.c $(git --git-dir="$llmc_git" rev-parse "$llmc_ref^{commit}")"
  echo "cudnn-frontend $fe_ref $(git --git-dir="$fe_git" rev-parse "$fe_ref^{commit}")"
} >"$out/SOURCES"
echo "llmc_bundle: $out ($(du -sh "$out" | cut -f1)): $(tr '\n' ' ' <"$out/SOURCES")"

# A correct but slow answer: the same register blocking in 16 x 16 block tiles (16 threads
# per block, half a warp), so every block re-reads far more and the SMs idle.
BM, BN = 16, 16
NT = (BM // TM) * (BN // TN)

# Stages vs model size: the largest GPT that trained on K stages of the same memory,
# without and with re-materialization, for a deeper and a wider family; dashed, K times
# the one-stage maximum (what "K devices hold K times the model" promises). Call with
#   gnuplot -e "data='model_size.dat'; out='model_size.png'; title_text='...'" model_size.gp
# model_size.dat: family K recompute params ratio_to_k_times_1 measured_peak_over_predicted
# (pipetrain-bench model-size, PIPETRAIN_BENCH_DATA_OUT); rows in K order per series.
# The R series (model-size --replicas) plots the same way with
#   -e "letter='R'; xname='copies R of one stage (optimizer split)'; families='depth'"
if (!exists("title_text")) title_text = "Stages vs model size"
if (!exists("letter")) letter = "K"
if (!exists("xname")) xname = "stages K"
if (!exists("families")) families = "depth width"
set terminal pngcairo size 1100,450 font "DejaVu Sans,10"
set output out
set termoption noenhanced
set multiplot layout 1,words(families) title title_text
set logscale xy 2
set xrange [0.8:10]
set xtics (1, 2, 4, 8)
set format y "%.0f"
set xlabel xname
set ylabel "parameters (millions)"
set grid lc rgb "#eeeeee"
set key top left box opaque
modes = "never always"
colours = "#4C72B0 #C44E52"
do for [fam in families] {
  set title (fam eq "depth" ? "deeper: d_model 128, more blocks" : "wider: 8 blocks, larger d_model")
  plot for [i = 1:2] data using (strcol(1) eq fam && strcol(3) eq word(modes, i) ? $2 : 1/0):($4 / 1e6) \
         with linespoints pt 7 lw 2 lc rgb word(colours, i) \
         title sprintf("recompute %s", word(modes, i)), \
       for [i = 1:2] data using (strcol(1) eq fam && strcol(3) eq word(modes, i) ? $2 : 1/0):($4 / $5 / 1e6) \
         with lines dt 2 lc rgb word(colours, i) title sprintf("%s x the %s = 1 maximum (%s)", letter, letter, word(modes, i))
}
unset multiplot
